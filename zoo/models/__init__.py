"""Model families, one file each. `create_model` turns a validated arch config into a module."""

from __future__ import annotations

from zoo.models.base import NotRecurrentError, ZooModel
from zoo.models.gated_rnn import GatedLinearRNN
from zoo.models.lsa import LinearSelfAttention


def create_model(arch, task) -> ZooModel:
    """Build the (untrained) model of `arch` (a registry arch spec) for `task`."""
    if arch.type == "lsa":
        return LinearSelfAttention(
            d=task.token_dim, readout=task.readout, n_layers=arch.n_layers, attention=arch.attention,
            loops=arch.loops, damping=arch.damping, init_std=arch.init_std, residual=arch.residual,
        )
    if arch.type == "gated_rnn":
        return GatedLinearRNN(
            d_in=task.token_dim, d_out=task.token_dim, readout=task.readout, hidden=arch.hidden, gates=arch.gates,
            recurrence=arch.recurrence, init_std=arch.init_std, nu_range=arch.lambda_range,
        )
    raise ValueError(f"unknown architecture type {arch.type!r}")


__all__ = ["create_model", "ZooModel", "NotRecurrentError", "LinearSelfAttention", "GatedLinearRNN"]
