"""The interface every zoo model follows.

    forward(tokens (B, T, d_in)) -> out (B, T, d_out)       causal unless the model says not
    predict(tokens)               -> the task's query read-out (B, d_y)
    init_state(batch)             -> tuple of state tensors, named by `state_names()`
    step(token (B, d_in), state)  -> (out (B, d_out), new state)
    forward_chunk(tokens, state)  -> (out (B, T, d_out), state after the last token)
`forward` equals `step` iterated from `init_state`, and `forward_chunk` from any state equals
`step` iterated from it (tested for every recurrent entry): `forward_chunk` is the parallel
form of a stream, exported as the chunk graph that streams long inputs in few runs.
Models whose memory grows with the sequence (softmax attention, or attention that lets
earlier tokens see later ones) set `recurrent = False` and `init_state` raises.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.tasks.regression import Readout


class NotRecurrentError(TypeError):
    """Raised by `init_state`/`step` on models that have no constant-size state."""


class ZooModel(nn.Module):
    recurrent: bool = True  # constant-size state: init_state / step work
    dynamic_time: bool = True  # the sequence graph exports with a symbolic length (fused LSTM/GRU: no)
    chunk_len: int = 1024  # the longest chunk the exported chunk graph takes (its scans' doublings)
    vmappable: bool = True  # torch.func.vmap runs it (ensembles); fused LSTM/GRU kernels have no batching rule
    compile_pays: bool = True  # a torch.compile'd training step is faster (not so around fused LSTM/GRU kernels)

    def __init__(self, d_in: int, d_out: int, readout: Readout):
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.readout = readout

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self(tokens))

    def predict_query(self, tokens: torch.Tensor) -> torch.Tensor:
        """The query's prediction (B, d_y), also for tasks that predict at every position."""
        return self.readout.query(self(tokens))

    def state_names(self) -> list[str]:
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        """`forward` continued from `state` (None: the zero state); also returns the state after the last token."""
        raise NotRecurrentError(f"{type(self).__name__} has no recurrent state")

    def check_state(self, state: tuple[torch.Tensor, ...], batch: int) -> None:
        """Clear error for a state of the wrong arity or shape (streaming runtimes call this)."""
        expected = self.init_state(batch)
        if len(state) != len(expected):
            raise ValueError(f"expected {len(expected)} state tensors {self.state_names()}, got {len(state)}")
        for name, got, want in zip(self.state_names(), state, expected):
            if tuple(got.shape) != tuple(want.shape):
                raise ValueError(f"state '{name}' has shape {tuple(got.shape)}, expected {tuple(want.shape)}")

    def _param_like(self) -> torch.Tensor:
        return next(self.parameters())
