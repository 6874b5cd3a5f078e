"""Analytic weights: the models that do gradient descent by construction.

Each family declares the constructions it supports next to its model (zoo/science/models/<family>.py:
the math, the rule saying when it applies, the hyper-parameters it records); this module applies
the one an entry names.
"""

from __future__ import annotations

from zoo.science.models import CONSTRUCTIONS
from zoo.science.models.fast_weight import construct_fast_weight
from zoo.science.models.gated_rnn import rnn_from_lsa
from zoo.science.models.gd_ssm import construct_gd_ssm
from zoo.science.models.lsa import construct_gd_lsa, gd_lsa_weights, lsa_weights
from zoo.science.models.stack_constructions import (
    lru_from_gated_rnn,
    lru_in_skip_from_lsa,
    lstm_from_gated_rnn,
    lstm_from_lsa,
)
from zoo.science.tasks.regression import resolve_eta


def construct(entry, model, task, validation_batch=None) -> dict:
    """Set `model`'s weights to the entry's construction (the registry has checked that it
    applies); returns the hyper-parameters used."""
    _, rule = CONSTRUCTIONS[entry.source.construction]
    return rule.apply(model, task, entry.source, validation_batch)


__all__ = ["construct", "construct_fast_weight", "construct_gd_lsa", "construct_gd_ssm", "gd_lsa_weights",
           "lru_from_gated_rnn", "lru_in_skip_from_lsa", "lsa_weights", "lstm_from_gated_rnn", "lstm_from_lsa", "resolve_eta",
           "rnn_from_lsa"]
