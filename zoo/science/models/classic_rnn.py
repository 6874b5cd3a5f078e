"""LSTM and GRU blocks (Hochreiter & Schmidhuber 1997; Cho et al. 2014), as compared in Zucchet
et al. (A.2, A.3; Figure 4) and the blogpost (uni- and bi-directional LSTMs).

`forward` runs torch's fused nn.LSTM / nn.GRU; `step` is the same cell written out with the
same parameters (PyTorch's gate order and biases), so streaming and batch agree (tested):

    LSTM   i, f, g, o = σ, σ, tanh, σ of (W_ih x + b_ih + W_hh h + b_hh) split in four
           c' = f ⊙ c + i ⊙ g ;  h' = o ⊙ tanh(c')
    GRU    r, z = σ(W_i{r,z} x + b_i{r,z} + W_h{r,z} h + b_h{r,z})
           n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)) ;  h' = (1 − z) ⊙ n + z ⊙ h

The fused kernels fix the sequence length when exported, so these models export their
whole-sequence graph at the task's length (`has_parallel_form = False`); the step graph streams
any length. A bidirectional LSTM sees the future and has no constant-size state.

A GRU layer that will be differentiated (grad enabled) or is vmapped runs `GRUSequence`, the same
function written out with a hand-written backward, which torch.compile fuses (issue 43); under
no_grad (inference, streaming, export) it runs the fused kernel. Its parameters sit in a `GRULayer`,
nn.GRU's parameters (same names, shapes, initial values) under another class: torch.compile does not
trace code that touches an nn.GRU module.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.science.models.base import RecurrentBlock


class LSTMBlock(RecurrentBlock):
    has_parallel_form = False
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


# GRU layers run `GRUSequence` (below) with grad enabled or under vmap; False: torch's fused kernel, as
# before (the benchmarks' plain baseline). Under no_grad (inference, streaming, export) the fused kernel runs.
WRITTEN_OUT_GRU_TRAINS = True


class GRUSequence(torch.autograd.Function):
    """torch's GRU layer (one direction, batch first) over a whole sequence, with a written-out backward.

    The same function as nn.GRU (its gate order, biases and cell, h' = n + z ⊙ (h − n)), for training:
    the fused CPU kernel records every step's dozen small ops for autograd (~15 backward nodes a step), so
    at small widths a step of the GRU layer is mostly dispatch. Here the input projections of all T steps
    are one GEMM, each forward step is one addmm and four elementwise ops, and the backward pass needs
    per step only

        dh_t = dy_t + dh'_{t+1} ;  dg_t = dh_t ⊗ K_t ;  dh'_t = z_t ⊙ dh_t + dg_t W_hh      (one addmm)

    where dg_t (B, 3w) is the gradient of the hidden pre-activations W_hh h + b_hh and K_t their
    coefficients, formed for all steps at once after the forward loop:

        K = [C ⊙ gh_n ⊙ r(1 − r),  (h − n) ⊙ z(1 − z),  C ⊙ r],   C = (1 − z)(1 − n²)

    The weight gradients are then one GEMM each over all B·T rows (dW_hh = Σ_t dg_tᵀ h_{t−1}, and the
    input side's dW_ih, db_ih and dx from dg with its n-block replaced by dh ⊙ C). Under torch.compile
    the steps' elementwise ops fuse. tests/test_train_speed_gru.py checks values and gradients against
    nn.GRU in float64."""

    generate_vmap_rule = True  # torch.func.vmap batches its ops (ensembles of GRUs)

    @staticmethod
    def forward(x, h0, w_ih, w_hh, b_ih, b_hh):
        # x (T, B, w_in) time-major, h0 (B, w) → y (T, B, w), and what the backward pass reads
        T, B, w = x.shape[0], x.shape[1], h0.shape[-1]
        gi = torch.addmm(b_ih, x.reshape(T * B, -1), w_ih.t()).view(T, B, 3 * w)
        w_hh_t, h, ys, rzs, ns, ghns = w_hh.t(), h0, [], [], [], []
        for t in range(T):
            gh = torch.addmm(b_hh, h, w_hh_t)  # (B, 3w)
            rz = torch.sigmoid(gi[t, :, : 2 * w] + gh[:, : 2 * w])
            r, z = rz[:, :w], rz[:, w:]
            gh_n = gh[:, 2 * w :]
            n = torch.tanh(torch.addcmul(gi[t, :, 2 * w :], r, gh_n))
            h = n + z * (h - n)
            ys.append(h)
            rzs.append(rz)
            ns.append(n)
            ghns.append(gh_n)
        y = torch.stack(ys)
        return y, torch.stack(rzs), torch.stack(ns), torch.stack(ghns)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, h0, w_ih, w_hh, _, _ = inputs
        y, rz, n, gh_n = output
        ctx.mark_non_differentiable(rz, n, gh_n)
        ctx.save_for_backward(x, h0, w_ih, w_hh, y, rz, n, gh_n)

    @staticmethod
    def backward(ctx, dy, _rz, _n, _gh_n):
        x, h0, w_ih, w_hh, y, rz, n, gh_n = ctx.saved_tensors
        T, B, w = y.shape
        h_prev = torch.cat([h0.unsqueeze(0), y[:-1]])  # (T, B, w)
        r, z = rz[..., :w], rz[..., w:]
        c = (1 - z) * (1 - n * n)
        k = torch.stack([c * gh_n * r * (1 - r), (h_prev - n) * z * (1 - z), c * r], dim=2)  # (T, B, 3, w)
        dh, dhs, dgs = torch.zeros_like(h0), [], []
        for t in range(T - 1, -1, -1):
            dh = dh + dy[t]  # the whole gradient of h_t
            dg = (dh.unsqueeze(1) * k[t]).view(B, 3 * w)  # of W_hh h_{t-1} + b_hh
            dhs.append(dh)
            dgs.append(dg)
            dh = torch.addmm(dh * z[t], dg, w_hh)  # of h_{t-1}
        dg = torch.stack(dgs[::-1]).view(T * B, 3 * w)
        di = torch.cat([dg.view(T, B, 3 * w)[..., : 2 * w], torch.stack(dhs[::-1]) * c], dim=2).view(T * B, 3 * w)
        x2 = x.reshape(T * B, -1)
        dx = (di @ w_ih).view(x.shape)
        return dx, dh, di.t() @ x2, dg.t() @ h_prev.reshape(T * B, w), di.sum(0), dg.sum(0)


class GRULayer(nn.Module):
    """nn.GRU(width, width, batch_first=True): its parameters (same names, shapes and initial values,
    drawn by nn.GRU itself) and its forward (the same fused kernel, `torch._VF.gru`, as nn.GRU.forward
    calls), in a module of another class. torch.compile refuses to trace code that touches an nn.GRU
    module (a graph break, so a compiled step ran `GRUSequence` eagerly); this one it traces."""

    def __init__(self, width: int):
        super().__init__()
        gru = nn.GRU(width, width, batch_first=True)
        self.input_size = self.hidden_size = width
        for name in GRU_PARAMETERS:
            setattr(self, name, getattr(gru, name))  # the Parameter itself: registered here under its name

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None):
        """nn.GRU's: x (B, T, width), hx (1, B, width) or None → y (B, T, width), h (1, B, width)."""
        if hx is None:
            hx = x.new_zeros(1, x.shape[0], self.hidden_size)
        weights = [getattr(self, name) for name in GRU_PARAMETERS]
        return torch._VF.gru(x, hx, weights, True, 1, 0.0, self.training, False, True)


GRU_PARAMETERS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")  # nn.GRU's, in its order


def gru_sequence(gru: GRULayer | nn.GRU, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """The GRU layer `gru` (one layer, one direction, batch first) on x (B, T, w_in) from h0 (B, w; None:
    zeros) through `GRUSequence`: y (B, T, w)."""
    if h0 is None:
        h0 = x.new_zeros(x.shape[0], gru.hidden_size)
    y = GRUSequence.apply(x.transpose(0, 1), h0, gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)[0]
    return y.transpose(0, 1)


class GRUBlock(RecurrentBlock):
    has_parallel_form = False
    # `GRUSequence` has a vmap rule, and ensembles of GRUs run (tests/test_train_speed_gru.py), but 8 members
    # measured 1.1× the fused kernel's plain step: one model at a time, as for the LSTM
    vmappable = False
    # compiled, training runs `GRUSequence` with each step's elementwise ops fused: 1.44–1.63× the fused kernel
    # (gru-student-d6) and 1.49–1.81× (gru-zucchet-icl), one thread, against 0.8× when the fused kernel was
    # compiled (reports/engineering/train-throughput-cpu.md)
    compile_pays = True

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.gru = GRULayer(width)  # nn.GRU's parameters and kernel

    def forward_chunk(self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        if WRITTEN_OUT_GRU_TRAINS and (torch.is_grad_enabled() or torch._C._functorch.is_batchedtensor(x)):
            # differentiable, or vmapped (an ensemble): the written-out layer, the same function with a
            # faster backward, and a batching rule (the fused kernel has none)
            y = gru_sequence(self.gru, x, None if state is None else state[0])  # (B, T, width)
            return y, (y[:, -1],)
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
