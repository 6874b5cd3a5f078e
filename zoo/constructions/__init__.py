"""Analytic weights: the models that do gradient descent by construction."""

from __future__ import annotations

from zoo.constructions.gd import construct_gd_lsa, gd_lsa_weights
from zoo.tasks.regression import gd_predict, line_search_eta


def resolve_eta(source, task, n_steps: int, validation_batch=None) -> float:
    """The η a construction entry asks for: a number, the analytic η*, or a line search."""
    if isinstance(source.eta, float):
        return source.eta
    if source.eta == "analytic":
        return task.analytic_eta()
    if validation_batch is None:
        raise ValueError("eta = 'line_search' needs the validation split")
    b = validation_batch

    def loss(eta: float) -> float:
        return task.loss(gd_predict(b, eta, steps=n_steps), b.targets).item()

    return line_search_eta(loss, 0.0, 2.5 * task.analytic_eta())


def construct(entry, model, task, validation_batch=None):
    """Set `model`'s weights to the entry's construction; returns the hyper-parameters used."""
    if entry.source.construction == "gd":
        if entry.arch.type != "lsa":
            raise ValueError(f"{entry.file}: entry '{entry.name}': construction 'gd' needs arch type 'lsa'")
        n_steps = entry.arch.n_layers * entry.arch.loops
        eta = resolve_eta(entry.source, task, n_steps, validation_batch)
        construct_gd_lsa(model, task.d_x, eta / entry.arch.damping)
        return {"eta": eta, "gd_steps": n_steps}
    raise ValueError(f"unknown construction {entry.source.construction!r}")


__all__ = ["construct", "construct_gd_lsa", "gd_lsa_weights", "resolve_eta"]
