"""The math of the deep stacks' constructions: LSTM and LRU layers set to stand for a linear self-attention
layer or a diagonal gated RNN (Zucchet et al. 2023, Appendix A, Tables 3–4). The stack family
(zoo/science/models/stack.py) registers them: when each applies, its knobs, what it records.

Table 3 counts the layers each type needs "to exactly implement our simplified class of gated RNNs and
linear self-attention":

                      gated RNN (Eq. 2)                       linear self-attention
    LSTM              2   `lstm_from_gated_rnn`               1   `lstm_from_lsa`
    LRU (Out)         2   `lru_from_gated_rnn`, variant out       (the gated RNN that implements it, exactly:
    LRU In+Out        1   `lru_from_gated_rnn`, variant in_out     Figure 1, `rnn_from_lsa`)
    LRU In+Skip       2   `lru_from_gated_rnn`, variant in_skip   1   `lru_in_skip_from_lsa`
    GRU               —                                        —

Every one presumes linear gates and activations, which an LSTM or LRU does not have; the paper's way
round it is to "double the number of output neurons" (A.1): a gate product (a·z)(b·z) is the difference
of two cells, σ(ε a·z)(b·z) − σ(0)(b·z) = (σ(ε a·z) − ½)(b·z) ≈ ε/4 (a·z)(b·z), read out ×4/ε by the next
linear map. The error is O(ε²) relative (σ(x) − ½ = x/4 − x³/48 + …; in the LSTM also tanh, below) until
rounding, amplified by the read-out weights, takes over; the constructions are `exact = False`.

Glossary (gated RNN, zoo/science/models/gated_rnn.py): x̃ = [x, 1]; `w_m_in, w_x_in` = W_m^in, W_x^in (n × (d+1));
λ (n); `w_m_out, w_x_out` = W_m^out, W_x^out (m × n); `readout_matrix` = D (d_out × m); ε = `scale`.
`model` is a stack (zoo/science/models/stack.py: embedding → blocks → head, `model.blocks`), `arch` its
`RecurrentStackArch`; the names stay unimported here, as stack.py imports this file. The stack's embedding
puts the token in channels 0…d−1 and, where x̃'s constant is needed, 1 in channel d
(its bias); the stack has no residual connections (Zucchet's comparison has none).
"""

from __future__ import annotations

import torch

from zoo.science.models.base import ZooModel
from zoo.science.models.classic_rnn import LSTMBlock
from zoo.science.models.gated_rnn import PERFECT_FORGET, PERFECT_MEMORY, GatedLinearRNN
from zoo.science.models.lru import LRUBlock


def _check_io(model: ZooModel, d_in: int, d_out: int, scale: float, name: str) -> None:
    """The stack reads and writes what the source model does, and ε > 0."""
    if (model.d_in, model.d_out) != (d_in, d_out):
        raise ValueError(f"{name}: the stack maps {model.d_in} → {model.d_out} channels, the model it stands for {d_in} → {d_out}")
    if not 0 < scale < float("inf"):
        raise ValueError(f"{name}: the linearisation scale ε must be finite and > 0, got {scale}")


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
def lstm_from_lsa(model: ZooModel, w_v: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor, scale: float) -> ZooModel:
    d = w_v.shape[0]
    _check_io(model, d, d, scale, "the LSTM construction")
    block = model.blocks[0]
    if len(model.blocks) != 1 or not isinstance(block, LSTMBlock) or block.bidirectional or block.width != lstm_width(d) or model.residual:
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
def lstm_from_gated_rnn(model: ZooModel, rnn: GatedLinearRNN, scale: float) -> ZooModel:
    """Set `model` (two LSTM layers of width `lstm2_width(n, m)`, no residual) to the stack that
    approximates the diagonal gated RNN `rnn`, in place; returns it."""
    n, m, d = rnn.hidden, rnn.gates, rnn.d_in
    width = lstm2_width(n, m)
    if rnn.recurrence != "diagonal":
        raise ValueError("the two-LSTM construction needs a diagonal gated RNN")
    _check_io(model, rnn.d_in, rnn.d_out, scale, "the two-LSTM construction")
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


# ---------------------------------------------------------------------------- LRUs ⇐ gated RNN, LSA
# Zucchet et al. A.1: "our class of gated RNNs can be implemented using two layers by letting the output
# gating of the first layer serve as input gating"; LRU In+Out "can implement both linear self-attention and
# our class of gated RNNs in one layer", LRU In+Skip "requires two layers for RNNs as described in Eq. 2" and
# one for attention, where "the skip part of the output gating computes the queries". In the zoo's LRU block
# (zoo/science/models/lru.py) u = σ(W_m^in x) ⊙ (W_x^in x) (In variants), h = λ ⊙ h + γ ⊙ (B u),
# ỹ = Re[C h] + D ⊙ u, y = σ(W_m ỹ or x) ⊙ (W_x ỹ). The pieces, each a pair trick or exact:
#
#   paired gating (`_paired_gating`): rows 2k, 2k+1 of (W_m, W_x) = (0, b_k), (ε a_k, b_k)
#        → y_2k+1 − y_2k = (σ(ε a_k·z) − ½)(b_k·z) ≈ ε/4 (a_k·z)(b_k·z)
#   recurrence (`_recurrence`): B reads 4/ε (u_2k+1 − u_2k) into neuron k (γ = 1), λ real (phase 0,
#        ν^log = log(−log λ), finite stand-ins for λ = 0, 1), C = I (ỹ_k = h_k), D = 0
#   pass-through: an output gate with W_m = 0 is σ(0) = ½ exactly, so W_x = 2I passes ỹ on; LRU Out's
#        layer 1 skips the recurrence with D = 1 (ỹ = x)
#
#   In+Out, 1 layer:   paired input gating (W_m^in, W_x^in on x̃) → recurrence → paired output gating
#                      (W_m^out, W_x^out on h) → read-out 4/ε D (pairs)
#   Out, 2 layers:     layer 1: ỹ = x, paired output gating (W_m^in, W_x^in on x̃);
#                      layer 2: recurrence on layer 1's pairs → paired output gating → read-out
#   In+Skip, 2 layers: layer 1: paired input gating → recurrence → pass-through (y = h);
#                      layer 2: paired input gating (W_m^out, W_x^out on h) → recurrence with λ = 0
#                      → pass-through → read-out D
#   In+Skip ⇐ LSA, 1 layer: paired input gating (W_V,i, W_K,j) → recurrence λ = 1 (S_ij) → output
#                      gating whose m branch sees the token: pairs (ε W_Q,j x, S_ij) → read-out 4/ε Σ_j
#
# The relative error is O((ε a·z)²) per paired gate: the input gates see the token, bounded at any length,
# but the output gates see the state h, and a memory neuron's state grows with the sequence, so at a fixed
# ε the error grows with T (as (εT)² in the LSTM too, where tanh(c) must also stay linear); the scripts'
# length sweep measures it (scripts/table_3_4_constructions.py).
def lru_size(hidden: int, gates: int, d: int, variant: str) -> dict[str, int]:
    """The LRU stack that stands for a gated RNN with `hidden` neurons and `gates` gates on d inputs:
    width (pairs of neurons and of gates, and x̃) and complex neurons per layer."""
    return {"width": max(2 * hidden, 2 * gates, d + 1), "hidden": max(hidden, gates) if variant == "in_skip" else hidden}


LRU_LAYERS = {"in_out": 1, "out": 2, "in_skip": 2}  # layers that stand for the gated RNN (Table 3)


def lru_in_skip_lsa_size(d: int) -> dict[str, int]:
    """One LRU In+Skip layer for a d × d LSA: a pair of output gates per key-value neuron (i, j)."""
    return {"width": max(2 * d * d, d + 1), "hidden": d * d}


def _paired_gating(w_m: torch.Tensor, w_x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eps: float) -> None:
    """Rows 2k, 2k+1 of a σ(W_m z) ⊙ (W_x z) gating: (0, b_k) and (ε a_k, b_k), each on z's first channels
    (as many as a, b have columns)."""
    k = a.shape[0]
    w_m[1 : 2 * k : 2, : a.shape[1]] = eps * a
    w_x[0 : 2 * k : 2, : b.shape[1]] = w_x[1 : 2 * k : 2, : b.shape[1]] = b


def _pair_difference(weight: torch.Tensor, matrix: torch.Tensor, eps: float) -> None:
    """weight (out, ≥ 2k) := 4/ε · matrix (out, k) applied to z_2k+1 − z_2k."""
    k = matrix.shape[1]
    weight[:, 1 : 2 * k : 2] = 4 / eps * matrix
    weight[:, 0 : 2 * k : 2] = -4 / eps * matrix


# Finite stand-ins for ν^log = ∓∞ and θ^log = −∞: the gated RNN's (λ = exp(−exp(ν)) as there: exactly 1 at
# ν^log = PERFECT_MEMORY = −100, exactly 0 at PERFECT_FORGET = 20, in float32 and float64), and the phase
# exp(−200), 0 in float32, 1.4e-87 in float64; unlike ±∞ their gradients are finite (0 · ∞ is NaN), so training
# can start from them.
NU_LOG_MEMORY, NU_LOG_FORGET, THETA_LOG_REAL = PERFECT_MEMORY, PERFECT_FORGET, -200.0


def _recurrence(block: LRUBlock, lam: torch.Tensor, eps: float) -> None:
    """Neuron k: h_k = λ_k h_k + 4/ε (u_2k+1 − u_2k), real; ỹ_k = h_k."""
    k = lam.shape[0]
    # λ = exp(−exp(ν^log)); λ = 1 and 0 give ν^log = ∓∞, clamped to the stand-ins (the same λ, exactly)
    block.nu_log[:k] = torch.log(-torch.log(lam.double())).clamp(NU_LOG_MEMORY, NU_LOG_FORGET)
    _pair_difference(block.b[:k, :, 0], torch.eye(k, dtype=lam.dtype), eps)
    block.c[:k, :k, 0] = torch.eye(k)


def _pass_through(block: LRUBlock, channels: int) -> None:
    """An output gate with W_m = 0 (σ(0) = ½ exactly) and W_x = 2I: y = ỹ on the first `channels`."""
    block.w_x[:channels, :channels] = 2 * torch.eye(channels)


def _reset(model: ZooModel, d: int, constant: bool) -> None:
    """Every weight 0 (γ = 1, no phase); the embedding puts the token in channels 0…d−1 and, with `constant`,
    x̃'s 1 in channel d."""
    for p in model.parameters():
        p.zero_()
    model.embed.weight[:d, :d] = torch.eye(d)
    if constant:
        model.embed.bias[d] = 1.0
    for block in model.blocks:
        block.theta_log.fill_(THETA_LOG_REAL)  # real λ everywhere
        block.nu_log.fill_(NU_LOG_FORGET)  # unused neurons: λ = 0


def _check_lru_stack(model: ZooModel, variant: str, layers: int, size: dict[str, int], name: str) -> None:
    blocks = model.blocks
    if (len(blocks) != layers or model.residual or any(not isinstance(b, LRUBlock) or b.variant != variant for b in blocks)
            or any(b.w_m.shape[0] != size["width"] or b.hidden != size["hidden"] for b in blocks)):
        raise ValueError(f"{name} needs {layers} 'lru' layer(s) of variant {variant!r}, width {size['width']} and "
                         f"hidden {size['hidden']}, without residual")


@torch.no_grad()
def lru_from_gated_rnn(model: ZooModel, rnn: GatedLinearRNN, scale: float) -> ZooModel:
    """Set `model` (LRU layers of one variant: In+Out ×1, Out ×2 or In+Skip ×2, sized by `lru_size`, no
    residual) to the stack that approximates the diagonal gated RNN `rnn`, in place; returns it."""
    if rnn.recurrence != "diagonal":
        raise ValueError("the LRU construction needs a diagonal gated RNN")
    _check_io(model, rnn.d_in, rnn.d_out, scale, "the LRU construction")
    variant = getattr(model.blocks[0], "variant", None)
    if variant not in LRU_LAYERS:
        raise ValueError("the LRU construction needs 'lru' layers")
    n, m, d, eps = rnn.hidden, rnn.gates, rnn.d_in, scale
    _check_lru_stack(model, variant, LRU_LAYERS[variant], lru_size(n, m, d, variant), "the LRU construction")
    _reset(model, d, constant=True)
    lam = rnn.lam()
    if variant == "in_out":
        (block,) = model.blocks
        _paired_gating(block.w_m_in, block.w_x_in, rnn.w_m_in, rnn.w_x_in, eps)
        _recurrence(block, lam, eps)
        _paired_gating(block.w_m, block.w_x, rnn.w_m_out, rnn.w_x_out, eps)
        _pair_difference(model.head.weight, rnn.readout_matrix, eps)
    elif variant == "out":
        first, second = model.blocks
        first.d[: d + 1] = 1.0  # ỹ = x̃ (B = C = 0)
        _paired_gating(first.w_m, first.w_x, rnn.w_m_in, rnn.w_x_in, eps)
        _recurrence(second, lam, eps)
        _paired_gating(second.w_m, second.w_x, rnn.w_m_out, rnn.w_x_out, eps)
        _pair_difference(model.head.weight, rnn.readout_matrix, eps)
    else:  # in_skip
        first, second = model.blocks
        _paired_gating(first.w_m_in, first.w_x_in, rnn.w_m_in, rnn.w_x_in, eps)
        _recurrence(first, lam, eps)
        _pass_through(first, n)
        _paired_gating(second.w_m_in, second.w_x_in, rnn.w_m_out, rnn.w_x_out, eps)
        _recurrence(second, torch.zeros(m, dtype=lam.dtype), eps)
        _pass_through(second, m)
        model.head.weight[:, :m] = rnn.readout_matrix
    return model


@torch.no_grad()
def lru_in_skip_from_lsa(model: ZooModel, w_v: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor,
                         scale: float) -> ZooModel:
    """Set `model` (one LRU In+Skip layer sized by `lru_in_skip_lsa_size(d)`, no residual) to the layer that
    approximates the causal LSA (W_V, W_K, W_Q): key-value neuron (i, j) stores S_ij = Σ v_i k_j, output gate
    pair (i, j) multiplies it by the query q_j = W_Q,j x that the skip branch reads from the token."""
    d, eps = w_v.shape[0], scale
    if not w_v.shape == w_k.shape == w_q.shape == (d, d):
        raise ValueError(f"the LRU In+Skip ⇐ LSA construction needs d × d W_V, W_K, W_Q, got {[tuple(w.shape) for w in (w_v, w_k, w_q)]}")
    _check_io(model, d, d, scale, "the LRU In+Skip ⇐ LSA construction")
    _check_lru_stack(model, "in_skip", 1, lru_in_skip_lsa_size(d), "the LRU In+Skip ⇐ LSA construction")
    _reset(model, d, constant=False)
    (block,) = model.blocks
    pairs = [(i, j) for i in range(d) for j in range(d)]
    _paired_gating(block.w_m_in, block.w_x_in, torch.stack([w_v[i] for i, _ in pairs]), torch.stack([w_k[j] for _, j in pairs]), eps)
    _recurrence(block, torch.ones(len(pairs), dtype=w_v.dtype), eps)
    _paired_gating(block.w_m, block.w_x, torch.stack([w_q[j] for _, j in pairs]), torch.eye(len(pairs), dtype=w_v.dtype), eps)
    _pair_difference(model.head.weight, torch.stack([torch.tensor([float(i == r) for i, _ in pairs]) for r in range(d)]).to(w_v.dtype), eps)
    return model
