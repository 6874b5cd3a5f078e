"""Analytic weights: the models that do gradient descent by construction."""

from __future__ import annotations

from zoo.constructions.fast_weight import construct_fast_weight
from zoo.constructions.gd import construct_gd_lsa, gd_lsa_weights
from zoo.constructions.gd_ssm import construct_gd_ssm
from zoo.constructions.lstm_from_lsa import lstm_from_lsa
from zoo.constructions.rnn_from_lsa import lsa_weights, rnn_from_lsa
from zoo.models.lsa import LinearSelfAttention
from zoo.tasks.regression import gd_predict, line_search_eta


def resolve_eta(eta: float | str, task, n_steps: int, validation_batch=None, ridge: float = 0.0) -> float:
    """The η an entry asks for: a number, "analytic" (η*) or "line_search" (best GD loss for
    `n_steps` steps on the validation split)."""
    if isinstance(eta, (int, float)):
        return float(eta)
    if eta == "analytic":
        return task.analytic_eta()
    if validation_batch is None:
        raise ValueError("eta = 'line_search' needs the validation split")
    b = validation_batch

    def loss(eta: float) -> float:
        return task.loss(gd_predict(b, eta, steps=n_steps, ridge=ridge), b.query_targets).item()

    return line_search_eta(loss, 0.0, 2.5 * task.analytic_eta())


def construct(entry, model, task, validation_batch=None):
    """Set `model`'s weights to the entry's construction (registry.construction_problem has
    checked that it applies); returns the hyper-parameters used."""
    source = entry.source
    if source.construction == "gd":
        n_steps = entry.arch.n_layers * entry.arch.loops
        eta = resolve_eta(source.eta, task, n_steps, validation_batch)
        construct_gd_lsa(model, task.d_x, eta / entry.arch.damping)
        return {"eta": eta, "gd_steps": n_steps}
    if source.construction == "gd_ssm":
        n_steps, ridge = entry.arch.n_layers, entry.arch.ridge
        eta = resolve_eta(source.eta, task, n_steps, validation_batch, ridge=ridge)
        construct_gd_ssm(model, task.layout, task.d_x, task.d_y, eta)
        return {"eta": eta, "gd_steps": n_steps, "ridge": ridge}
    if source.construction in ("hebbian_gd", "delta_rule"):
        return construct_fast_weight(model, task, source.construction, source.eta)
    if source.construction in ("rnn_from_lsa", "lstm_from_lsa"):
        info = {"lsa": source.lsa}
        if source.lsa == "teacher":
            lsa = task.teacher()
        else:
            eta = resolve_eta(source.eta, task, 1, validation_batch)
            lsa = LinearSelfAttention(task.token_dim, task.readout, attention="causal", residual=False).double()
            construct_gd_lsa(lsa, task.d_x, eta)
            info["eta"] = eta
        if source.construction == "lstm_from_lsa":
            lstm_from_lsa(model, *lsa_weights(lsa), scale=source.scale)
            return {**info, "scale": source.scale}
        rnn = rnn_from_lsa(*lsa_weights(lsa), task.readout, compact=source.compact)
        model.load_state_dict(rnn.state_dict())  # strict; casts the float64 construction to the model's dtype
        return {**info, "compact": source.compact}
    raise ValueError(f"unknown construction {source.construction!r}")


__all__ = ["construct", "construct_gd_lsa", "construct_gd_ssm", "lstm_from_lsa", "gd_lsa_weights", "resolve_eta", "rnn_from_lsa", "lsa_weights"]
