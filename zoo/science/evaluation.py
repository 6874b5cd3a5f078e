"""Evaluation on a frozen split: the model's loss beside GD and least squares, and the
blogpost's three alignment metrics against GD (by default one step at the analytic η*; k
steps for models built to do k); for teacher–student tasks, Zucchet et al.'s polynomial
distance and KV/Q scores instead:

    pred_l2_to_gd         mean_n ‖f(θ; e_n) − ŷ_GD,n‖²
    sensitivity_l2_to_gd  mean_n ‖∂f(θ)/∂x_q − W_k,n‖²_F      (autograd; ŷ_GD = W_k x_q)
    sensitivity_cosine    mean_n cos(vec ∂f(θ)/∂x_q, vec W_k,n)
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from zoo.science.analysis.polynomial import (
    coefficients,
    polynomial_distance,
    prediction_map,
    regression_coefficient_table,
)
from zoo.science.models import FAMILY_OF_TYPE
from zoo.science.models.base import NotRecurrentError
from zoo.science.models.lsa import loop_curve, teacher_lsa  # noqa: F401  (loop_curve: the LSA's Figure 13, `zoo eval --loops`)
from zoo.science.registry import get_task_spec
from zoo.science.tasks.frozen import load_split
from zoo.science.tasks.regression import (
    LinearRegressionTask,
    TaskBatch,
    empirical_eta,
    gd_predict,
    gd_weights,
    least_squares_predict,
    online_gd_predict,
    prefix_gd_predict,
    prefix_least_squares_predict,
    resolve_eta,
)

TASKS_PER_PASS = 2500  # the most tasks per pass: bounds autograd's memory on 10 000-task splits
# ... and fewer where a recurrent model's (tasks, T, state) intermediates would outgrow the cache: a pass holds at
# most this many state floats (16 MiB of float32), in whole multiples of PASS_ALIGN tasks. Mamba's state is 1,216
# floats a token, so 2,500 tasks of 21 tokens made 255 MB tensors, each elementwise op a trip to memory; in passes
# of 128 tasks its predictions on 10,000 tasks take 0.95 s instead of 2.8 s (2 threads). Whole multiples of 64
# tasks keep the kernels' vector loops as they were: predictions equal bit for bit at 64·k tasks for Mamba, the
# GD-SSM, S5, Griffin, not always at other sizes; where they are not, they differ by float32 rounding (~1e-7).
PASS_STATE_FLOATS = 2**22
PASS_ALIGN = 64


def tasks_per_pass(model, n_tokens: int) -> int:
    """Tasks scored per pass of `model` over prompts of `n_tokens` tokens (see PASS_STATE_FLOATS)."""
    try:
        width = sum(math.prod(shape) for _, shape in model.state_shapes())  # state floats per sequence
    except (NotRecurrentError, NotImplementedError, AttributeError):  # attention, or a plain torch module
        return TASKS_PER_PASS
    fits = PASS_STATE_FLOATS // max(1, n_tokens * width)
    return max(PASS_ALIGN, min(TASKS_PER_PASS, fits // PASS_ALIGN * PASS_ALIGN))


def predictions_and_sensitivities(model, tokens: torch.Tensor, query_channels: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Query predictions (N, d_y) and their Jacobians w.r.t. x_query (N, d_y, d_x), in passes
    (`tasks_per_pass`); x_query is `tokens[:, -1, start:stop]`. The predictions are the full forward's."""
    return query_predictions(model, tokens), query_sensitivities(model, tokens, query_channels)


def query_predictions(model, tokens: torch.Tensor) -> torch.Tensor:
    """The predictions at the query (N, d_y) of the full forward, in passes (`tasks_per_pass`)."""
    with torch.no_grad():
        return torch.cat([model.predict_query(chunk) for chunk in tokens.split(tasks_per_pass(model, tokens.shape[1]))])


def query_sensitivities(model, tokens: torch.Tensor, query_channels: tuple[int, int]) -> torch.Tensor:
    """∂ŷ/∂x_query (N, d_y, d_x) in passes: `query_jacobian_by_step` where the model is recurrent and reads
    its prediction at the last token (tested against `query_jacobian_autograd`), else autograd."""
    fast = getattr(model, "recurrent", False) and model.readout.position in (-1, None)
    jacobian = query_jacobian_by_step if fast else query_jacobian_autograd
    passes = tokens.split(tasks_per_pass(model, tokens.shape[1]))
    return torch.cat([jacobian(model, chunk, query_channels) for chunk in passes])


def query_jacobian_autograd(model, tokens: torch.Tensor, query_channels: tuple[int, int]) -> torch.Tensor:
    """∂ŷ/∂x_query (N, d_y, d_x) by autograd through the whole forward: the reference. Tasks are
    independent, so the gradient of Σ_n ŷ_n,j gives every task's row j at once."""
    start, stop = query_channels
    tokens = tokens.detach().clone().requires_grad_(True)
    return _jacobian_rows(model.predict_query(tokens), tokens)[:, :, -1, start:stop]


def query_jacobian_by_step(model, tokens: torch.Tensor, query_channels: tuple[int, int]) -> torch.Tensor:
    """∂ŷ/∂x_query (N, d_y, d_x) of a causal recurrent model whose query is the last token: the state
    before the query does not depend on x_query, so the Jacobian is that of one `step` from it (the
    state computed without a graph). Equal to `query_jacobian_autograd` to rounding, at a fraction of
    its cost: through a Mamba's whole forward on 2,500 21-token tasks the backward held (B, T, e, N)."""
    start, stop = query_channels
    with torch.no_grad():
        _, state = model.forward_chunk(tokens[:, :-1], None)  # the state after the context
    query = tokens[:, -1].detach().clone().requires_grad_(True)  # (n, d)
    out, _ = model.step(query, state)
    return _jacobian_rows(model.readout.channels(out), query)[:, :, start:stop]


def _jacobian_rows(pred: torch.Tensor, wrt: torch.Tensor) -> torch.Tensor:
    """(n, d_y, *wrt.shape[1:]): ∂pred[n, j]/∂wrt[n] for predictions (n, d_y) of independent tasks, one
    backward pass per output j (the gradient of Σ_n pred[n, j] is every task's row j at once)."""
    rows = [torch.autograd.grad(pred[:, j].sum(), wrt, retain_graph=j + 1 < pred.shape[1])[0] for j in range(pred.shape[1])]
    return torch.stack(rows, dim=1)


def evaluate(model, task, batch, *, eta: float | None = None, gd_steps: int = 1, ridge: float = 0.0) -> dict:
    """All metrics of `model` on `batch` (a frozen split of `task`). On a task with a GD reference the model is
    compared with `gd_steps` GD steps at rate `eta` (default: one step at the analytic η*) and least squares;
    on a task with a teacher, its polynomial map with the teacher's (Table 1); then the metrics its family adds
    (`model.family_metrics`). Nothing here knows a concrete task or family: each answers for itself."""
    if task.has_gd_reference:
        metrics = evaluate_regression(model, task, batch, eta=eta, gd_steps=gd_steps, ridge=ridge)
        if model.has_polynomial_map() and task.layout == "pairs":
            # Table 2: the instantaneous polynomial of the first output unit vs one GD step
            metrics["polynomial"] = regression_coefficient_table(model, task.d_x, task.d_y)
    else:
        metrics = evaluate_loss(model, task, batch)
    if task.teacher_weights() is not None and model.has_polynomial_map():
        student, _ = coefficients(prediction_map(model), task.prediction_dim)
        teacher, _ = coefficients(prediction_map(teacher_lsa(task)), task.prediction_dim)
        metrics["polynomial_distance"] = polynomial_distance(student, teacher)
    metrics.update(model.family_metrics(task, batch))
    return metrics


def evaluate_loss(model, task, batch) -> dict:
    """The task's loss of the model's predictions on `batch`, for tasks without GD or least squares."""
    model.eval()
    param = next(model.parameters())
    with torch.no_grad():
        pred = model.predict(batch.tokens.to(param))
    return {"test_loss": task.loss(pred, batch.targets.to(pred)).item(), "n_tasks": int(batch.tokens.shape[0])}


def loss_alone(model, task, batch) -> float:
    """`evaluate`'s `test_loss` of `model` on `batch` alone, computed as `evaluate` computes it (the same
    predictions, in the same passes), without the GD references and the alignment metrics' Jacobians."""
    if not task.has_gd_reference:
        return evaluate_loss(model, task, batch)["test_loss"]
    model.eval()
    param = next(model.parameters())
    tokens = batch.tokens.to(device=param.device, dtype=param.dtype)
    return task.loss(query_predictions(model, tokens), batch.query_targets.to(tokens)).item()


def float32_rounding(model, task, batch) -> float:
    """|loss in float32 − loss in float64| of `model`'s predictions on `batch`: how far float32 rounding alone moves
    this model's number (what a re-score through another float32 runtime, ONNX Runtime's kernels, can differ by).
    Most models: ~1e-7 of the loss; the LSTM ≈ LSA construction, which reads out with weights 16/ε³, ~3e-3; an
    exact construction whose loss is itself rounding (~1e-14) moves by about the loss."""
    losses = []
    for dtype in (torch.float32, torch.float64):
        model = copy.deepcopy(model).to(dtype).eval()
        with torch.no_grad():
            passes = batch.tokens.split(tasks_per_pass(model, batch.tokens.shape[1]))
            pred = torch.cat([model.predict(chunk.to(dtype)) for chunk in passes])
        losses.append(task.loss(pred.double(), batch.targets.double()).item())
    return abs(losses[0] - losses[1])


def gd_reference(entry, task, construction: dict | None = None, validation_batch=None,
                 recorded: dict | None = None) -> dict:
    """The GD an entry is scored against: as many steps as its construction took (GD-SSM: one
    per layer, with its ridge), at the η its construction used, else the η recorded in its
    metrics, else the analytic one-step η* (one step) or a line search on the validation split.
    Empty on a task without a GD reference."""
    if not task.has_gd_reference:
        return {}
    construction, recorded = construction or {}, recorded or {}
    family_steps, ridge = FAMILY_OF_TYPE[entry.arch.type].gd_reference(entry.arch)
    steps = construction.get("gd_steps") or family_steps
    eta = construction.get("eta", recorded.get("gd_eta"))
    if eta is None and steps > 1 and validation_batch is not None:
        eta = resolve_eta("line_search", task, steps, validation_batch, ridge=ridge)
    return {"eta": eta, "gd_steps": steps, "ridge": ridge}


def evaluate_regression(model, task: LinearRegressionTask, batch: TaskBatch, *, eta: float | None = None,
                        gd_steps: int = 1, ridge: float = 0.0) -> dict:
    """The blogpost's metrics against GD, the model in its own dtype. The reference is the
    defining math, not a model: after k steps ŷ_GD = W_k x_q, so ∂ŷ_GD/∂x_q = W_k."""
    eta = task.analytic_eta() if eta is None else eta
    model.eval()
    param = next(model.parameters())
    tokens = batch.tokens.to(device=param.device, dtype=param.dtype)
    targets = batch.query_targets.to(tokens)
    pred, sens = predictions_and_sensitivities(model, tokens, task.query_channels)

    b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
    baselines = baseline_losses(task, b64, eta, gd_steps, ridge)
    metrics = {
        "test_loss": task.loss(pred, targets).item(),
        "gd_loss": baselines["gd_loss"],
        "gd_eta": eta,
        "gd_steps": gd_steps,
        "lstsq_loss": baselines["lstsq_loss"],
        **alignment(pred, sens, b64, eta, gd_steps, ridge),
        "n_tasks": int(tokens.shape[0]),
    }
    if task.every_position:
        metrics.update(position_curves(model, tokens, b64, baselines["position"]))
    return metrics


_BASELINES: dict[tuple, dict] = {}  # the last few splits' baselines (a release scores many entries per split)


def baseline_losses(task: LinearRegressionTask, b64: TaskBatch, eta: float, gd_steps: int = 1, ridge: float = 0.0) -> dict:
    """GD's and least squares' losses on the tasks of `b64` (and, where every position predicts, their
    curves against position, `position_baselines`): they depend on the split, not the model, so each is
    computed once per split in a process (the data identified by its bytes' digest), GD's once per
    (η, steps, ridge)."""
    import hashlib

    digest = hashlib.blake2b(b64.x.numpy().tobytes() + b64.y.numpy().tobytes(), digest_size=16).hexdigest()
    split = _BASELINES.pop((task, digest), None)
    if split is None:
        split = {"lstsq_loss": task.loss(least_squares_predict(b64), b64.query_targets).item()}
        if task.every_position:
            split["position"] = position_baselines(task, b64)
    _BASELINES[task, digest] = split  # the most recently used last
    while len(_BASELINES) > 8:
        _BASELINES.pop(next(iter(_BASELINES)))
    gd = ("gd_loss", float(eta), gd_steps, float(ridge))
    if gd not in split:
        split[gd] = task.loss(gd_predict(b64, eta, gd_steps, ridge), b64.query_targets).item()
    out = {"gd_loss": split[gd], "lstsq_loss": split["lstsq_loss"]}
    if "position" in split:
        out["position"] = copy.deepcopy(split["position"])  # the caller's own lists
    return out


def alignment(pred: torch.Tensor, sens: torch.Tensor, b64: TaskBatch, eta: float, gd_steps: int = 1,
              ridge: float = 0.0) -> dict:
    """The blogpost's three metrics between a model's query predictions (N, d_y) and sensitivities
    (N, d_y, d_x) and `gd_steps` GD steps at rate `eta` on the same tasks."""
    ref_sens = gd_weights(b64, eta, gd_steps, ridge).to(sens)  # (N, d_y, d_x)
    ref_pred = (ref_sens @ b64.x_query.to(sens).unsqueeze(-1)).squeeze(-1)
    flat, ref_flat = sens.flatten(1), ref_sens.flatten(1)
    # in float64, and 0 where either sensitivity is 0: torch's eps-clamped cosine divided float32 sensitivities that
    # underflow (a model collapsed to a constant) by eps and returned values like −5e5
    a, b = flat.double(), ref_flat.double()
    norms = a.norm(dim=1) * b.norm(dim=1)
    cos = torch.where(norms > 0, (a * b).sum(1) / norms.clamp_min(1e-300), torch.zeros_like(norms)).clamp(-1, 1)
    return {
        "pred_l2_to_gd": ((pred - ref_pred) ** 2).sum(1).mean().item(),
        "sensitivity_l2_to_gd": ((flat - ref_flat) ** 2).sum(1).mean().item(),
        "sensitivity_cosine": cos.mean().item(),
    }


PROBE_TASKS = 2000  # validation tasks an alignment probe scores: the metrics' sampling error ~1/√2000 of their spread


def alignment_probe(task: LinearRegressionTask, batch: TaskBatch, *, eta: float | None = None, gd_steps: int = 1,
                    ridge: float = 0.0, tasks: int = PROBE_TASKS):
    """probe(model) → `alignment` with `gd_steps` GD steps at `eta` (default: the analytic η*) on the
    first `tasks` tasks of `batch` (a frozen split): the blogpost's Figure 10 curves when
    `zoo.running.train.fit` calls it at every eval step. Only the query tokens get gradients (the model's
    parameter gradients are untouched), and the model's train/eval mode is left as it was."""
    eta = task.analytic_eta() if eta is None else eta
    x, y = batch.x[:tasks], batch.y[:tasks]
    b64 = task.batch_from_arrays(x.double(), y.double())
    tokens = task.batch_from_arrays(x, y).tokens  # (tasks, T, d_in)

    def probe(model) -> dict:
        param = next(model.parameters())
        pred, sens = predictions_and_sensitivities(model, tokens.to(device=param.device, dtype=param.dtype),
                                                   task.query_channels)
        return alignment(pred.cpu(), sens.cpu(), b64, eta, gd_steps, ridge)

    return probe


def gd_rate_curve(model, task: LinearRegressionTask, batch: TaskBatch, etas: list[float]) -> dict:
    """The blogpost's Figure 12: the three alignment metrics between the model and one GD step at
    each rate η in `etas`, with that GD's loss (`curve`); the model's predictions and input-gradients
    are computed once. Also the rates the figure is about: `closest_eta`, the η whose GD predictions
    are nearest the model's (the prediction L2 is quadratic in η, so exact), `loss_eta`, the η with
    the lowest GD loss on these tasks (the blogpost's closed form), and the analytic η*. Always one
    GD step: the figure is about a one-layer model's rate."""
    if not task.has_gd_reference:
        raise ValueError("GD-rate curves are defined for in-context regression tasks, not a teacher-student task")
    model.eval()
    param = next(model.parameters())
    pred, sens = predictions_and_sensitivities(model, batch.tokens.to(param), task.query_channels)
    pred, sens = pred.double(), sens.double()
    b64 = task.batch_from_arrays(batch.x.double(), batch.y.double())
    g = gd_predict(b64, 1.0)  # one step at rate 1: GD at rate η predicts η g
    curve = [{"eta": eta, "gd_loss": task.loss(eta * g, b64.query_targets).item(), **alignment(pred, sens, b64, eta)}
             for eta in etas]
    return {"curve": curve, "closest_eta": float((pred * g).sum() / (g * g).sum()), "loss_eta": empirical_eta(b64),
            "analytic_eta": task.analytic_eta()}


def position_curves(model, tokens: torch.Tensor, b64: TaskBatch, baselines: dict) -> dict:
    """Loss against position for a model that predicts y_{t+1} after every example t = 1..C, beside
    the baselines on the same prefix: one GD step at η*_t (optimal per position) and at the query's
    η*_C (one fixed rate), online GD (the delta rule) at η = 1/(σ_x² d_x), and least squares."""
    with torch.no_grad():
        pred = torch.cat([model.predict(chunk) for chunk in tokens.split(tasks_per_pass(model, tokens.shape[1]))])  # (N, C, d_y)
    return {"position_loss": position_loss(pred, b64), **baselines}  # baselines: `position_baselines(task, b64)`


def position_loss(pred: torch.Tensor, b64: TaskBatch) -> list[float]:
    """½·MSE at each position t of predictions (N, C, d_y) of y_{t+1}."""
    return (0.5 * ((pred.double() - b64.y[:, 1:]) ** 2).mean(dim=(0, 2))).tolist()


def position_baselines(task: LinearRegressionTask, b64: TaskBatch) -> dict:
    """The baselines of `position_curves` on the tasks of `b64` (float64), position by position."""
    return {
        "position_gd_loss": position_loss(prefix_gd_predict(b64, task.prefix_etas()), b64),
        "position_gd_fixed_loss": position_loss(prefix_gd_predict(b64, torch.full((task.n_context,), task.analytic_eta())), b64),
        "position_online_gd_loss": position_loss(online_gd_predict(b64, task.online_eta()), b64),
        "position_lstsq_loss": position_loss(prefix_least_squares_predict(b64), b64),
    }


def input_scale_curve(model, task: LinearRegressionTask, scales: list[float], *, eta: float | None = None,
                      gd_steps: int = 1, ridge: float = 0.0, n: int = 2000, seed: int = 0) -> list[dict]:
    """Loss of the model and of GD (at the training distribution's η) on inputs x ~ U(−α, α)
    for each α in `scales` (Sushma, Tian et al. Figs. 1D/2D: out-of-distribution input scales).
    Tasks are sampled from `seed`, the same ones for every model."""
    if not task.has_gd_reference:
        raise ValueError("input-scale curves are defined for in-context regression tasks")
    eta = task.analytic_eta() if eta is None else eta
    param = next(model.parameters())
    rows = []
    for alpha in scales:
        shifted = dataclasses.replace(task, x_scale=task.x_scale * alpha)
        b = shifted.sample(n, seed=seed, dtype=torch.float64)
        with torch.no_grad():
            pred = model.predict_query(b.tokens.to(param)).double()
        rows.append({"input_scale": alpha, "test_loss": task.loss(pred, b.query_targets).item(),
                     "gd_loss": task.loss(gd_predict(b, eta, gd_steps, ridge), b.query_targets).item()})
    return rows


def rescore(ckpt, split=None) -> dict:
    """Score a checkpoint on its frozen test split (hash-checked against the registry, or for an unregistered
    variant against its regeneration from its seed; or `split`) exactly as the build scored it: the same
    reference GD, so `test_loss` re-scores to the card's number (it matches its card)."""
    task = ckpt.task
    split = split if split is not None else load_split(ckpt.entry.task, "test", spec=get_task_spec(ckpt.entry.task))
    reference = gd_reference(ckpt.entry, task, ckpt.construction, recorded=ckpt.metrics)
    return evaluate(ckpt.model, task, split.batch(task), **reference)
