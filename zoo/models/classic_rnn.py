"""LSTM and GRU blocks (Hochreiter & Schmidhuber 1997; Cho et al. 2014), as compared in Zucchet
et al. (A.2, A.3; Figure 4) and the blogpost (uni- and bi-directional LSTMs).

`forward` runs torch's fused nn.LSTM / nn.GRU; `step` is the same cell written out with the
same parameters (PyTorch's gate order and biases), so streaming and batch agree (tested):

    LSTM   i, f, g, o = σ, σ, tanh, σ of (W_ih x + b_ih + W_hh h + b_hh) split in four
           c' = f ⊙ c + i ⊙ g ;  h' = o ⊙ tanh(c')
    GRU    r, z = σ(W_i{r,z} x + b_i{r,z} + W_h{r,z} h + b_h{r,z})
           n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)) ;  h' = (1 − z) ⊙ n + z ⊙ h

The fused kernels fix the sequence length when exported, so these models export their
whole-sequence graph at the task's length (`dynamic_time = False`); the step graph streams
any length. A bidirectional LSTM sees the future and has no constant-size state.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import RecurrentBlock


class LSTMBlock(RecurrentBlock):
    dynamic_time = False
    vmappable = False  # torch's fused LSTM has no vmap batching rule: ensembles train its seeds one by one
    compile_pays = False  # torch.compile leaves the fused kernel as it is: compiled steps measured 0.9× eager

    def __init__(self, width: int, bidirectional: bool = False):
        super().__init__()
        self.recurrent = not bidirectional
        self.width = width
        self.bidirectional = bidirectional
        hidden = width // 2 if bidirectional else width
        self.lstm = nn.LSTM(width, hidden, batch_first=True, bidirectional=bidirectional)
        # the forward direction alone, run with `lstm`'s weights (a tuple keeps it out of the state dict)
        self._forward_direction = (nn.LSTM(width, hidden, batch_first=True),) if bidirectional else ()

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        y, (h, c) = self.lstm(x, None if state is None else (state[0].unsqueeze(0), state[1].unsqueeze(0)))
        return y, (h[-1], c[-1])  # (B, T, width); the last direction's final state (the only one when recurrent)

    def forward_last(self, x: torch.Tensor) -> torch.Tensor:
        """(B, width) at the last position. Bidirectional, the backward direction's output there is
        one cell step from the zero state on the last token, so only the forward direction runs the
        whole sequence (the fused kernel, with this layer's forward weights)."""
        if not self.bidirectional:
            return super().forward_last(x)
        lstm = self.lstm
        forward_weights = {name: getattr(lstm, name) for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")}
        ahead = torch.func.functional_call(self._forward_direction[0], forward_weights, (x,))[0][:, -1]  # (B, width/2)
        gates = x[:, -1] @ lstm.weight_ih_l0_reverse.T + lstm.bias_ih_l0_reverse + lstm.bias_hh_l0_reverse  # h = 0
        i, _, g, o = gates.chunk(4, dim=-1)  # c = 0: the forget gate multiplies nothing
        back = torch.sigmoid(o) * torch.tanh(torch.sigmoid(i) * torch.tanh(g))  # (B, width/2)
        return torch.cat([ahead, back], dim=-1)

    def state_shapes(self):
        return [("h", (self.width,)), ("c", (self.width,))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        h, c = state
        gates = x @ self.lstm.weight_ih_l0.T + self.lstm.bias_ih_l0 + h @ self.lstm.weight_hh_l0.T + self.lstm.bias_hh_l0
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, (h, c)


class GRUBlock(RecurrentBlock):
    dynamic_time = False
    vmappable = False  # as LSTMBlock
    compile_pays = False  # as LSTMBlock (measured 0.8× eager)

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.gru = nn.GRU(width, width, batch_first=True)

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        y, h = self.gru(x) if state is None else self.gru(x, state[0].unsqueeze(0))  # (B, T, width)
        return y, (h[-1],)

    def state_shapes(self):
        return [("h", (self.width,))]

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]):
        (h,) = state
        gi = x @ self.gru.weight_ih_l0.T + self.gru.bias_ih_l0
        gh = h @ self.gru.weight_hh_l0.T + self.gru.bias_hh_l0
        i_r, i_z, i_n = gi.chunk(3, dim=-1)
        h_r, h_z, h_n = gh.chunk(3, dim=-1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h = (1 - z) * n + z * h
        return h, (h,)
