"""An LSTM layer that approximates a causal linear self-attention layer (Zucchet et al. A.2,
Table 4, left), made exact in the limit of a small linearisation scale ε.

Table 4 sets f = 1 (b_f = +∞), c̃ = W_K x, g = W_V x, o = W_Q x and assumes c̃, g, o, tanh(c)
linear. With the real nonlinearities, neuron (i, j, a, b) ∈ [d]² × {0, 1}² uses (torch's
gate names in brackets)

    g  [input gate]  = σ(ε a · v_i)          c̃ [cell candidate] = tanh(ε k_j)
    f  [forget gate] = σ(+100) = 1           o  [output gate]    = σ(ε b · q_j)

so c_{ij,a} = Σ_s σ(ε a v_i) tanh(ε k_j) and h = o ⊙ tanh(c). The read-out combines the four
copies (the "double the neurons" trick of A.1, once for g and once for o):

    out_i = 16/ε³ Σ_j (h_ij11 − h_ij10 − h_ij01 + h_ij00)
          = 16/ε³ Σ_j (σ(ε q_j) − ½)(tanh c_ij1 − tanh c_ij0)  →  Σ_j q_j S_ij  as ε → 0

with relative error O(ε²) (σ(x) − ½ = x/4 − x³/48 + …, tanh x = x − x³/3 + …, and tanh(c)
linear only while c = O(ε T) is small), until rounding, amplified by 16/ε³, takes over. The
layer needs 4d² neurons; its input is the token itself (embedding = [I; 0]).
"""

from __future__ import annotations

import torch

from zoo.models.classic_rnn import LSTMBlock
from zoo.models.stack import SequenceStack

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
