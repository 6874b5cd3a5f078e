"""Reverse-engineering gated RNNs (Zucchet et al. section 3): which neurons remember (λ ≈ 1),
which forget (λ ≈ 0), whether they linearly encode key-values and queries (KV / Q scores),
and which neurons can be pruned without changing the function."""

from __future__ import annotations

import copy
from typing import Callable

import torch

# The probes the family's own metrics use live beside the model (zoo/science/models/gated_rnn.py); re-exported here.
from zoo.science.models.gated_rnn import (  # noqa: F401
    GatedLinearRNN,
    active_neurons,
    gated_rnn_matrices,
    imperfect_memory_effect,
    kv_q_scores,
    lambda_groups,
    memory_leak,
    prune,
    r2_score,
    silence_hidden,
)


@torch.no_grad()
def silence_gate(rnn: GatedLinearRNN, index: int) -> None:
    """Cut gate `index` off the read-out: D never reads it."""
    rnn.readout_matrix[:, index] = 0


@torch.no_grad()
def prune_by_function(rnn: GatedLinearRNN, loss: Callable[[GatedLinearRNN], float], *, hidden: int, gates: int,
                      groups: list[tuple[torch.Tensor, int]] | None = None) -> tuple[GatedLinearRNN, list[dict]]:
    """Greedy pruning by function (the zoo's, not the paper's exact-zero pruning `prune`): silence the
    hidden neuron whose silencing raises `loss(rnn)` least, one at a time, until `hidden` are left;
    then the gates the same way down to `gates`. `groups` (masks over the hidden neurons, each with how
    many of it to keep; `hidden` is then unused) prunes each group to its own count instead, each cut
    the least harmful among the groups still too large. Returns the smaller RNN and the curve of
    (hidden, gates, loss) after each cut."""
    rnn = copy.deepcopy(rnn)
    alive_hidden, alive_gates = active_neurons(rnn)
    groups = groups if groups is not None else [(torch.ones_like(alive_hidden), hidden)]
    curve = [{"hidden": int(alive_hidden.sum()), "gates": int(alive_gates.sum()), "loss": loss(rnn)}]

    def cut(alive: torch.Tensor, candidates: torch.Tensor, silence) -> None:
        trials = []
        for i in candidates.nonzero().flatten().tolist():
            trial = copy.deepcopy(rnn)
            silence(trial, i)
            trials.append((loss(trial), i))
        best_loss, best = min(trials)
        silence(rnn, best)
        alive[best] = False
        now_hidden, now_gates = active_neurons(rnn)
        curve.append({"hidden": int(now_hidden.sum()), "gates": int(now_gates.sum()), "loss": best_loss})

    while True:
        too_large = [mask for mask, keep in groups if int((alive_hidden & mask).sum()) > keep]
        if not too_large:
            break
        cut(alive_hidden, alive_hidden & torch.stack(too_large).any(0), silence_hidden)
    alive_gates = active_neurons(rnn)[1]  # gates that only read silenced neurons are dead already
    while int(alive_gates.sum()) > gates:
        cut(alive_gates, alive_gates.clone(), silence_gate)
    return prune(rnn), curve
