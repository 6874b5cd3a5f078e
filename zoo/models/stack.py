"""A deep sequence model from recurrent blocks: linear embedding → L blocks → linear read-out.

    x_0 = E s_t ;  x_l = x_{l−1} + block_l(x_{l−1})  (residual; or x_l = block_l(x_{l−1}))
    out_t = W_out x_L

No normalisation layers (Zucchet et al. A.1 compare LRUs, LSTMs and GRUs "without norms").
A block implements `forward_chunk(x (B, T, h), state | None) -> (y, state after the last step)`
(`forward` is it from the zero state), `state_shapes()` → [(name, shape without batch)] and
`step(x (B, h), state) -> (y, new_state)`; the stack names the state `<layer>.<name>` and the
tests of every family check `forward_chunk` = iterated `step`.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import NotRecurrentError, ZooModel
from zoo.tasks.regression import Readout


class RecurrentBlock(nn.Module):
    recurrent = True  # has a constant-size state and `step`
    dynamic_time = True  # `forward` exports with a symbolic sequence length
    chunk_len = 1024  # the longest chunk the exported chunk graph takes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_chunk(x, None)[0]

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        raise NotImplementedError

    def state_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        raise NotImplementedError

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        raise NotImplementedError


class SequenceStack(ZooModel):
    def __init__(self, d_in: int, d_out: int, readout: Readout, blocks: list[RecurrentBlock], width: int,
                 residual: bool = True):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, d_out)
        self.residual = residual
        self.recurrent = all(block.recurrent for block in blocks)
        self.dynamic_time = all(block.dynamic_time for block in blocks)
        self.chunk_len = min(block.chunk_len for block in blocks)
        self.vmappable = all(getattr(block, "vmappable", True) for block in blocks)
        self.compile_pays = all(getattr(block, "compile_pays", True) for block in blocks)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, h)
        for block in self.blocks:
            y = block(x)
            x = x + y if self.residual else y
        return self.head(x)  # (B, T, d_out)

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        self._require_recurrent()
        x, new_state, i = self.embed(tokens), [], 0
        for block in self.blocks:
            n = len(block.state_shapes())
            y, block_state = block.forward_chunk(x, None if state is None else tuple(state[i : i + n]))
            i += n
            new_state.extend(block_state)
            x = x + y if self.residual else y
        return self.head(x), tuple(new_state)

    # ------------------------------------------------------------------ recurrence
    def _require_recurrent(self) -> None:
        if not self.recurrent:
            raise NotRecurrentError(f"{type(self).__name__} with these blocks sees the future (bidirectional); no recurrent state")

    def state_names(self) -> list[str]:
        self._require_recurrent()
        return [f"{i}.{name}" for i, block in enumerate(self.blocks) for name, _ in block.state_shapes()]

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        self._require_recurrent()
        p = self._param_like()
        return tuple(p.new_zeros(batch, *shape) for block in self.blocks for _, shape in block.state_shapes())

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        self._require_recurrent()
        x, new_state, i = self.embed(token), [], 0
        for block in self.blocks:
            n = len(block.state_shapes())
            y, block_state = block.step(x, tuple(state[i : i + n]))
            i += n
            new_state.extend(block_state)
            x = x + y if self.residual else y
        return self.head(x), tuple(new_state)
