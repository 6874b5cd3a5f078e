"""Evaluation on a frozen split: the model's loss beside θ_GD and least squares, and the
blogpost's three alignment metrics against θ_GD (and, for teacher–student tasks, Zucchet
et al.'s polynomial distance and KV/Q scores) (one GD step at the analytic η*):

    pred_l2_to_gd         mean_n ‖f(θ; e_n) − f(θ_GD; e_n)‖²
    sensitivity_l2_to_gd  mean_n ‖∂f(θ)/∂x_q − ∂f(θ_GD)/∂x_q‖²_F      (autograd)
    sensitivity_cosine    mean_n cos(vec ∂f(θ)/∂x_q, vec ∂f(θ_GD)/∂x_q)
"""

from __future__ import annotations

import copy

import torch

from zoo.analysis.polynomial import coefficients, polynomial_distance, prediction_map, regression_coefficient_table
from zoo.analysis.rnn import kv_q_scores
from zoo.constructions.gd import construct_gd_lsa
from zoo.models.gated_rnn import GatedLinearRNN
from zoo.models.lsa import LinearSelfAttention
from zoo.tasks.teacher import LSATeacherTask
from zoo.tasks.regression import LinearRegressionTask, TaskBatch, gd_predict, least_squares_predict

CHUNK = 2500  # tasks per autograd pass: bounds memory on 10 000-task splits


def gd_reference(task: LinearRegressionTask, eta: float, dtype=torch.float64) -> LinearSelfAttention:
    model = LinearSelfAttention(task.token_dim, task.readout, n_layers=1, attention="strict_causal").to(dtype)
    return construct_gd_lsa(model, task.d_x, eta)


def predictions_and_sensitivities(model, tokens: torch.Tensor, d_x: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query predictions (N, d_y) and their Jacobians w.r.t. x_query (N, d_y, d_x), chunked."""
    preds, sens = [], []
    for chunk in tokens.split(CHUNK):
        chunk = chunk.detach().clone().requires_grad_(True)
        pred = model.predict(chunk)  # (n, d_y); tasks are independent, so Σ_n gives per-task grads
        rows = []
        for j in range(pred.shape[1]):
            (g,) = torch.autograd.grad(pred[:, j].sum(), chunk, retain_graph=j + 1 < pred.shape[1])
            rows.append(g[:, -1, :d_x])
        preds.append(pred.detach())
        sens.append(torch.stack(rows, dim=1))
    return torch.cat(preds), torch.cat(sens)


def evaluate(model, task, batch, *, eta: float | None = None) -> dict:
    """All metrics of `model` on `batch` (a frozen split of `task`)."""
    if isinstance(task, LSATeacherTask):
        return evaluate_teacher_student(model, task, batch)
    metrics = evaluate_regression(model, task, batch, eta=eta)
    if has_polynomial_map(model):
        # Table 2: the instantaneous polynomial of the first output unit vs one GD step
        metrics["polynomial"] = regression_coefficient_table(copy.deepcopy(model), task.d_x, task.d_y)
    return metrics


def has_polynomial_map(model) -> bool:
    if isinstance(model, LinearSelfAttention):
        return len(model.layers) == 1 and model.loops == 1
    return hasattr(model, "instantaneous")


def evaluate_teacher_student(model, task: LSATeacherTask, batch) -> dict:
    """Loss, and how the student's instantaneous polynomial matches the teacher's (Table 1)."""
    model.eval()
    param = next(model.parameters())
    with torch.no_grad():
        pred = model.predict(batch.tokens.to(param))
    metrics = {"test_loss": task.loss(pred, batch.targets.to(pred)).item(), "n_tasks": int(batch.tokens.shape[0])}
    if has_polynomial_map(model):
        student, _ = coefficients(prediction_map(copy.deepcopy(model)), task.d)
        teacher, _ = coefficients(prediction_map(task.teacher()), task.d)
        metrics["polynomial_distance"] = polynomial_distance(student, teacher)
    if isinstance(model, GatedLinearRNN) and model.recurrence == "diagonal":
        metrics.update(kv_q_scores(copy.deepcopy(model), task.teacher_weights()))
    return metrics


def evaluate_regression(model, task: LinearRegressionTask, batch: TaskBatch, *, eta: float | None = None) -> dict:
    """The blogpost's metrics against θ_GD, computed in the model's dtype."""
    eta = task.analytic_eta() if eta is None else eta
    model.eval()
    param = next(model.parameters())
    tokens = batch.tokens.to(device=param.device, dtype=param.dtype)
    targets = batch.targets.to(tokens)
    pred, sens = predictions_and_sensitivities(model, tokens, task.d_x)

    ref = gd_reference(task, eta, dtype=param.dtype).to(param.device)
    ref_pred, ref_sens = predictions_and_sensitivities(ref, tokens, task.d_x)

    b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
    flat, ref_flat = sens.flatten(1), ref_sens.flatten(1)
    cos = torch.nn.functional.cosine_similarity(flat, ref_flat, dim=1, eps=1e-30)
    return {
        "test_loss": task.loss(pred, targets).item(),
        "gd_loss": task.loss(gd_predict(b64, eta), b64.targets).item(),
        "gd_eta": eta,
        "lstsq_loss": task.loss(least_squares_predict(b64), b64.targets).item(),
        "pred_l2_to_gd": ((pred - ref_pred) ** 2).sum(1).mean().item(),
        "sensitivity_l2_to_gd": ((flat - ref_flat) ** 2).sum(1).mean().item(),
        "sensitivity_cosine": cos.mean().item(),
        "n_tasks": int(tokens.shape[0]),
    }
