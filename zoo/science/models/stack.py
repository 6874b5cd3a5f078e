"""A deep sequence model from recurrent blocks: linear embedding → L blocks → linear read-out.

    x_0 = E s_t ;  x_l = x_{l−1} + block_l(x_{l−1})  (residual; or x_l = block_l(x_{l−1}))
    out_t = W_out x_L

No normalisation layers: Zucchet et al. (section 3.3) compare LRUs, LSTMs and GRUs without "layer
normalization, dropout, or skip connections" (their entries turn the residual off).
A block implements `forward_chunk(x (B, T, h), state | None) -> (y, state after the last step)`
(`forward` is it from the zero state), `state_shapes()` → [(name, shape without batch)] and
`step(x (B, h), state) -> (y, new_state)`; the stack names the state `<layer>.<name>` and the
tests of every family check `forward_chunk` = iterated `step`.

This file is the family of the deep stacks: one config schema for every block type (LRU, S5,
LSTM, GRU, bi-LSTM, Mamba, Griffin; the blocks live in their own files), the table from block
type to block, and the two LSTM constructions of Zucchet et al. A.2, Table 4: one layer ⇐ an LSA layer
(left half), two layers ⇐ a diagonal gated RNN of Eq. 2 (right half).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, NotRecurrentError, RecurrentBlock, ZooModel
from zoo.science.models.classic_rnn import GRUBlock, LSTMBlock
from zoo.science.models.gated_rnn import GatedLinearRNN, RNNFromLSAKnobs, rnn_from_lsa, rnn_size
from zoo.science.models.griffin import GriffinRecurrentBlock, LocalAttentionBlock
from zoo.science.models.lru import LRUBlock, S5Block
from zoo.science.models.lsa import ImplementedLSA, implemented_lsa, lsa_problem, lsa_width
from zoo.science.models.mamba import MambaBlock
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout


class SequenceStack(ZooModel):
    def __init__(self, d_in: int, d_out: int, readout: Readout, blocks: list[RecurrentBlock], width: int,
                 residual: bool = True):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, d_out)
        self.residual = residual
        self.recurrent = all(block.recurrent for block in blocks)
        self.has_parallel_form = all(block.has_parallel_form for block in blocks)
        self.chunk_len = min(block.chunk_len for block in blocks)
        self.vmappable = all(getattr(block, "vmappable", True) for block in blocks)
        self.compile_pays = all(getattr(block, "compile_pays", True) for block in blocks)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self._through(self.blocks, self.embed(tokens)))  # (B, T, d_out)

    def _through(self, blocks, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, h) through `blocks`, with the residual connections when the stack has them."""
        for block in blocks:
            y = block(x)
            x = x + y if self.residual else y
        return x

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position, the last block and the head run for that position
        only (`forward_last`: a bi-LSTM's backward direction is then one step). A causal stack drops
        the tokens after the query; one that sees the future keeps them, and reads the last token
        only (otherwise it takes the full forward pass)."""
        position = self.readout.position
        if position is None or (not self.recurrent and position != -1):
            return super().predict(tokens)
        x = self._through(self.blocks[:-1], self.embed(tokens[:, : self.readout.query_end(tokens.shape[1])]))  # (B, q, h)
        y = self.blocks[-1].forward_last(x)  # (B, h)
        return self.readout.channels(self.head(x[:, -1] + y if self.residual else y))  # (B, d_y)

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

    def state_shapes(self):
        self._require_recurrent()
        return [(f"{i}.{name}", shape) for i, block in enumerate(self.blocks) for name, shape in block.state_shapes()]

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


# ---------------------------------------------------------------------------- LSTM ⇐ LSA
# An LSTM layer that approximates a causal linear self-attention layer (Zucchet et al. A.2,
# Table 4, left), made exact in the limit of a small linearisation scale ε. Table 4 sets f = 1
# (b_f = +∞), c̃ = W_K x, g = W_V x, o = W_Q x and assumes c̃, g, o, tanh(c) linear. With the real
# nonlinearities, neuron (i, j, a, b) ∈ [d]² × {0, 1}² uses (torch's gate names in brackets)
#
#     g  [input gate]  = σ(ε a · v_i)          c̃ [cell candidate] = tanh(ε k_j)
#     f  [forget gate] = σ(+100) = 1           o  [output gate]    = σ(ε b · q_j)
#
# so c_{ij,a} = Σ_s σ(ε a v_i) tanh(ε k_j) and h = o ⊙ tanh(c). The read-out combines the four
# copies (the "double the neurons" trick of A.1, once for g and once for o):
#
#     out_i = 16/ε³ Σ_j (h_ij11 − h_ij10 − h_ij01 + h_ij00)
#           = 16/ε³ Σ_j (σ(ε q_j) − ½)(tanh c_ij1 − tanh c_ij0)  →  Σ_j q_j S_ij  as ε → 0
#
# with relative error O(ε²) (σ(x) − ½ = x/4 − x³/48 + …, tanh x = x − x³/3 + …, and tanh(c)
# linear only while c = O(ε T) is small), until rounding, amplified by 16/ε³, takes over. The
# layer needs 4d² neurons; its input is the token itself (embedding = [I; 0]).
FORGET_BIAS = 100.0  # σ(100) = 1 exactly in float32 and float64: perfect memory


def lstm_width(d: int) -> int:
    return 4 * d * d


@torch.no_grad()
def lstm_from_lsa(model: SequenceStack, w_v: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor, scale: float) -> SequenceStack:
    d = w_v.shape[0]
    (block,) = model.blocks
    if not isinstance(block, LSTMBlock) or block.width != lstm_width(d) or model.residual:
        raise ValueError(f"the LSTM construction needs one LSTM layer of width 4d² = {lstm_width(d)} without residual")
    for p in model.parameters():
        p.zero_()
    model.embed.weight[:d, :d] = torch.eye(d)
    lstm, width = block.lstm, block.width
    w_ih = lstm.weight_ih_l0.view(4, width, width)  # torch gate order: input (g), forget, cell (c̃), output (o)
    lstm.bias_ih_l0.view(4, width)[1] = FORGET_BIAS
    coef = 16 / scale**3
    for i in range(d):
        for j in range(d):
            for a in (0, 1):
                for b in (0, 1):
                    n = ((i * d + j) * 2 + a) * 2 + b
                    w_ih[0, n, :d] = scale * a * w_v[i]
                    w_ih[2, n, :d] = scale * w_k[j]
                    w_ih[3, n, :d] = scale * b * w_q[j]
                    model.head.weight[i, n] = coef * (1 if a == b else -1)
    return model


# ---------------------------------------------------------------------------- two LSTMs ⇐ gated RNN
# Two LSTM layers that approximate a diagonal gated RNN h_t = λ ⊙ h_{t−1} + (W_m^in x̃_t) ⊙ (W_x^in x̃_t),
# y_t = D ((W_m^out h_t) ⊙ (W_x^out h_t)) (Zucchet et al. A.2, Table 4, right): in layer 1 g ⊙ c̃ is the
# input gating and f = λ (b_f = σ⁻¹(λ)); in layer 2 f = 0 (b_f = −∞) and g ⊙ c̃ is the output gating;
# o = 1 (b_o = +∞) in both. The table "ignores the linearization trick for the tanh in c̃ and the sigmoid
# in g" and also leaves h = o ⊙ tanh(c) as it is; with the real nonlinearities, every neuron of the RNN
# is a pair (a ∈ {0, 1}) of cells, as in the left half (ε = `scale`):
#
#   layer 1, hidden neuron k:  g = σ(ε a · W_m,k^in x̃)   c̃ = tanh(ε W_x,k^in x̃)   f = λ_k   o = 1
#        c_k1 − c_k0 = Σ_s λ_k^{t−s} (σ(ε u_s) − ½) tanh(ε v_s) ≈ ε²/4 · h_k
#        (x̃'s appended 1 is the bias; h¹ = tanh(c) ≈ c while c = O(ε T) is small)
#   layer 2, gate j:  its input is r = 4/ε² (h¹_·1 − h¹_·0) ≈ h, the gated RNN's state
#        g = σ(ε b · W_m,j^out r)   c̃ = tanh(ε W_x,j^out r)   f = 0   o = 1
#        h²_j1 − h²_j0 ≈ ε²/4 · (W_m,j^out h)(W_x,j^out h)
#   read-out:  y_i = 4/ε² Σ_j D_ij (h²_j1 − h²_j0)
#
# Relative error O(ε²) (the cubic terms of σ and tanh, and tanh(c) with c = O(ε T)) until rounding,
# amplified by 4/ε² twice, takes over. Width 2·max(n, m): 2n cells in layer 1, 2m in layer 2 (the
# zoo's LSTM layers have one width); recurrent weights V are 0 in both layers, as in the table.
def lstm2_width(hidden: int, gates: int) -> int:
    return 2 * max(hidden, gates)


def _logit(p: torch.Tensor) -> torch.Tensor:
    """σ⁻¹(p), clamped to ±FORGET_BIAS: σ(100) = 1 and σ(−100) = 3.7e-44, perfect memory and forgetting."""
    return (torch.log(p) - torch.log1p(-p)).clamp(-FORGET_BIAS, FORGET_BIAS)


@torch.no_grad()
def lstm_from_gated_rnn(model: SequenceStack, rnn: GatedLinearRNN, scale: float) -> SequenceStack:
    """Set `model` (two LSTM layers of width `lstm2_width(n, m)`, no residual) to the stack that
    approximates the diagonal gated RNN `rnn`, in place; returns it."""
    n, m, d = rnn.hidden, rnn.gates, rnn.d_in
    width = lstm2_width(n, m)
    if rnn.recurrence != "diagonal":
        raise ValueError("the two-LSTM construction needs a diagonal gated RNN")
    if (len(model.blocks) != 2 or model.residual or any(not isinstance(b, LSTMBlock) or b.bidirectional for b in model.blocks)
            or model.blocks[0].width != width or width < d):
        raise ValueError(f"the two-LSTM construction needs two LSTM layers of width 2·max(n, m) = {width} without residual")
    for p in model.parameters():
        p.zero_()
    eps = scale
    model.embed.weight[:d, :d] = torch.eye(d)
    first, second = (block.lstm for block in model.blocks)
    for lstm in (first, second):
        lstm.bias_ih_l0.view(4, width)[3] = FORGET_BIAS  # torch gate order: input (g), forget, cell (c̃), output (o)
    w_in, b_in = first.weight_ih_l0.view(4, width, width), first.bias_ih_l0.view(4, width)
    b_in[1, : 2 * n] = _logit(rnn.lam()).repeat_interleave(2)
    w_in[0, 1 : 2 * n : 2, :d], b_in[0, 1 : 2 * n : 2] = eps * rnn.w_m_in[:, :d], eps * rnn.w_m_in[:, d]  # a = 1
    w_in[2, 0 : 2 * n : 2, :d] = w_in[2, 1 : 2 * n : 2, :d] = eps * rnn.w_x_in[:, :d]
    b_in[2, 0 : 2 * n : 2] = b_in[2, 1 : 2 * n : 2] = eps * rnn.w_x_in[:, d]
    # r = 4/ε² (h¹_·1 − h¹_·0): layer 2's weights on h¹ are ε · W^out · that difference
    w_out, b_out = second.weight_ih_l0.view(4, width, width), second.bias_ih_l0.view(4, width)
    b_out[1] = -FORGET_BIAS
    for rows, gating in ((slice(1, 2 * m, 2), rnn.w_m_out), (None, rnn.w_x_out)):
        coef = eps * 4 / eps**2 * gating  # (m, n)
        if rows is None:  # c̃: both cells of a pair
            for start in (0, 1):
                w_out[2, start : 2 * m : 2, 1 : 2 * n : 2], w_out[2, start : 2 * m : 2, 0 : 2 * n : 2] = coef, -coef
        else:  # g: only the a = 1 cell
            w_out[0, rows, 1 : 2 * n : 2], w_out[0, rows, 0 : 2 * n : 2] = coef, -coef
    readout = 4 / eps**2 * rnn.readout_matrix  # (d_out, m)
    model.head.weight[:, 1 : 2 * m : 2], model.head.weight[:, 0 : 2 * m : 2] = readout, -readout
    return model


# ---------------------------------------------------------------------------- the family
class RecurrentStackArch(Strict):
    """Embedding → n_layers blocks → read-out, no norms."""

    type: Literal["lru", "s5", "lstm", "gru", "bilstm", "mamba", "griffin"]
    width: int = Field(64, gt=0)  # embedding width w
    n_layers: int = Field(1, ge=1)  # blocks (Griffin alternates recurrent and local attention)
    hidden: int | None = Field(None, gt=0)  # LRU/S5 complex neurons n (default: width)
    residual: bool | None = None  # x_l = x_{l-1} + block_l(x_{l-1}); None: the type's default (RESIDUAL_FREE)
    variant: Literal["out", "in_out", "in_skip"] = "out"  # LRU gating (Zucchet A.1): LRU Out / In+Out / In+Skip
    r_range: tuple[float, float] = (0.0, 1.0)  # LRU initial |λ| range
    state_size: int = Field(16, gt=0)  # Mamba N
    expand: int = Field(2, gt=0)  # Mamba/Griffin inner width = expand · width
    window: int = Field(8, ge=1)  # Griffin local attention window

    @model_validator(mode="after")
    def _variant_is_lru_only(self):
        if self.variant != "out" and self.type != "lru":
            raise ValueError(f"'variant' applies to type 'lru' only, not {self.type!r}")
        if self.type == "bilstm" and self.width % 2:
            raise ValueError("a bidirectional LSTM needs an even width (two directions of width/2)")
        return self


BLOCKS = {  # arch type → block of layer i
    "lru": lambda a, i: LRUBlock(a.width, a.hidden or a.width, a.variant, *a.r_range),
    "s5": lambda a, i: S5Block(a.width, a.hidden or a.width),
    "lstm": lambda a, i: LSTMBlock(a.width),
    "gru": lambda a, i: GRUBlock(a.width),
    "bilstm": lambda a, i: LSTMBlock(a.width, bidirectional=True),
    "mamba": lambda a, i: MambaBlock(a.width, a.state_size, a.expand),
    "griffin": lambda a, i: LocalAttentionBlock(a.width, a.window) if i % 2 else GriffinRecurrentBlock(a.width, a.expand),
}
# Types without a residual by default: the classic RNN stacks as Zucchet et al. compare them. Zucchet's
# LRUs have none either (section 3.3: "we do not include any of those" skip connections); their entries
# say `residual = false`, as the default for "lru" stays the residual that older checkpoints were built with.
RESIDUAL_FREE = ("lstm", "gru", "bilstm")


def build(arch: RecurrentStackArch, task) -> SequenceStack:
    blocks = [BLOCKS[arch.type](arch, i) for i in range(arch.n_layers)]
    residual = arch.type not in RESIDUAL_FREE if arch.residual is None else arch.residual
    return SequenceStack(task.token_dim, task.d_out, task.readout, blocks, arch.width, residual=residual)


class LSTMFromLSAKnobs(ImplementedLSA):
    scale: float = Field(0.01, gt=0)  # linearisation scale ε (error O(ε²) until rounding)


def _lstm_from_lsa_problem(arch: RecurrentStackArch, task, source) -> str | None:
    problem = lsa_problem(task, source)
    if problem:
        return problem
    d = lsa_width(task)
    if arch.type != "lstm" or arch.n_layers != 1 or arch.width != lstm_width(d) or arch.residual:
        return f"'lstm_from_lsa' needs one 'lstm' layer of width 4d² = {lstm_width(d)} without residual"
    return None


def _apply_lstm_from_lsa(model: SequenceStack, task, source, validation_batch=None) -> dict:
    weights, info = implemented_lsa(task, source, validation_batch)
    lstm_from_lsa(model, *weights, scale=source.scale)
    return {**info, "scale": source.scale}


class LSTMFromGatedRNNKnobs(RNNFromLSAKnobs):
    scale: float = Field(0.01, gt=0)  # linearisation scale ε of both layers (error O(ε²) until rounding)


def _lstm2_width_for(task, source) -> int:
    return lstm2_width(**rnn_size(lsa_width(task), source.compact))


def _lstm_from_gated_rnn_problem(arch: RecurrentStackArch, task, source) -> str | None:
    problem = lsa_problem(task, source)
    if problem:
        return problem
    width = _lstm2_width_for(task, source)
    if arch.type != "lstm" or arch.n_layers != 2 or arch.width != width or arch.residual:
        return f"'lstm_from_gated_rnn' needs two 'lstm' layers of width 2·max(n, m) = {width} without residual"
    return None


def _apply_lstm_from_gated_rnn(model: SequenceStack, task, source, validation_batch=None) -> dict:
    """The LSA (θ_GD or the teacher) → the gated RNN that implements it exactly (float64) → two LSTM layers."""
    weights, info = implemented_lsa(task, source, validation_batch)
    rnn = GatedLinearRNN(model.d_in, model.d_out, model.readout, **rnn_size(lsa_width(task), source.compact)).double()
    rnn_from_lsa(rnn, *(w.double() for w in weights), compact=source.compact)
    lstm_from_gated_rnn(model, rnn, scale=source.scale)
    return {**info, "compact": source.compact, "scale": source.scale}


FAMILY = Family(
    name="stack",
    arch=RecurrentStackArch,
    build=build,
    constructions={"lstm_from_lsa": ConstructionRule(_lstm_from_lsa_problem, _apply_lstm_from_lsa,
                                                     "an LSTM layer ≈ an LSA layer, exact as ε → 0", arch_types=("lstm",),
                                                     knobs=LSTMFromLSAKnobs, exact=False),
                   "lstm_from_gated_rnn": ConstructionRule(
                       _lstm_from_gated_rnn_problem, _apply_lstm_from_gated_rnn,
                       "two LSTM layers ≈ the gated RNN that implements an LSA layer, exact as ε → 0",
                       arch_types=("lstm",), knobs=LSTMFromGatedRNNKnobs, exact=False)},
    card="""
A deep recurrent stack (linear embedding → blocks → linear read-out, no normalisation layers, as
Zucchet et al. A.1 compare them): LRU (with its gating variants), S5, LSTM, GRU, bi-LSTM, Mamba or
Griffin blocks, trained on the same frozen tasks as the models that implement gradient descent and
scored with the same metrics.
""",
)
