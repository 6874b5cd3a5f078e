"""Softmax transformer in the Garg et al. / blogpost setting: GPT-2-style pre-norm blocks,
one head, learned positions (optional), and no causal mask on the regression prompt (every token sees
the whole prompt), so it has no recurrent form.

    x_0 = E s + P ;  x ← x + Attn(LN(x)) ;  x ← x + MLP(LN(x))  (L times) ;  out = W_out LN(x)
    Attn(x)_t = W_o Σ_s softmax_s(q_tᵀ k_s / √d) v_s            (s ≤ t only with `causal`)

Glossary: `embed` = E, `positions` = P (max_len × w), `blocks` = the L layers, `head` = W_out.

Without positions (`positions=False`, P = 0) and unmasked, every block is equivariant to the order
of the tokens, so the read-out at the query is a function of the query token and the *set* of
context tokens: what in-context regression asks for, and the blogpost's parameter counts
(attention and its layer norm alone, 16,768 a layer at width 64) leave no room for a table.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from zoo.science.models.base import Family, ZooModel
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout


class TransformerBlock(nn.Module):
    def __init__(self, width: int, heads: int, mlp: bool):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.ln_attn = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)) if mlp else None

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        B, T, w = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).view(B, T, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, T, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(w // self.heads)  # (B, H, T, T)
        if causal:
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attended = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, w)
        x = x + self.proj(attended)
        return x + self.mlp(x) if self.mlp is not None else x

    def forward_last(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output at the last position only (B, w), which attends to every position.
        Equals `forward(x, causal)[:, -1]` with or without the mask (the last row of the mask is
        all open). One query reads the keys and values only through two sums, so W_k and W_v fold
        into it and no token's key or value is formed (B·w² FLOPs each, not B·T·w²):

            q·k_s = q·(W_k h_s + b_k) = (W_kᵀ q)·h_s + q·b_k
            Σ_s a_s v_s = W_v (Σ_s a_s h_s) + b_v          (Σ_s a_s = 1)
        """
        B, T, w = x.shape
        H, d = self.heads, w // self.heads
        h = self.ln_attn(x)  # (B, T, w)
        w_q, w_k, w_v = self.qkv.weight.split(w)  # (w, w) each, head-major rows
        b_q, b_k, b_v = self.qkv.bias.split(w)
        q = F.linear(h[:, -1], w_q, b_q).view(B, H, d)  # (B, H, d)
        q_in = torch.einsum("bhd,hdw->bhw", q, w_k.view(H, d, w))  # (B, H, w): W_kᵀ q per head
        scores = q_in @ h.transpose(1, 2) + (q * b_k.view(H, d)).sum(-1, keepdim=True)  # (B, H, T)
        weights = F.softmax(scores / math.sqrt(d), dim=-1)  # (B, H, T)
        mixed = weights @ h  # (B, H, w): Σ_s a_s h_s per head
        attended = torch.einsum("bhw,hdw->bhd", mixed, w_v.view(H, d, w)) + b_v.view(H, d)  # (B, H, d)
        x = x[:, -1] + self.proj(attended.reshape(B, w))  # (B, w)
        return x + self.mlp(x) if self.mlp is not None else x


class SoftmaxTransformer(ZooModel):
    recurrent = False

    def __init__(self, d_in: int, d_out: int, readout: Readout, *, width: int = 64, n_layers: int = 1, heads: int = 1,
                 mlp: bool = True, causal: bool = False, positions: bool = True, max_len: int = 256):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        self.causal = causal
        self.max_len = max_len
        self.embed = nn.Linear(d_in, width)
        self.positions = nn.Parameter(torch.randn(max_len, width) * 0.02) if positions else None
        self.blocks = nn.ModuleList(TransformerBlock(width, heads, mlp) for _ in range(n_layers))
        self.ln_out = nn.LayerNorm(width)
        self.head = nn.Linear(width, d_out)

    @property
    def max_tokens(self) -> int | None:
        return self.max_len if self.positions is not None else None  # without a table any length reads the same way

    def embed_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """x_0 = E s + P (B, T, w)."""
        T = tokens.shape[1]
        if self.positions is not None and T > self.max_len:  # without a table any length reads the same way
            raise ValueError(f"sequence of {T} tokens is longer than max_len = {self.max_len}")
        x = self.embed(tokens)  # (B, T, w)
        return x + self.positions[:T] if self.positions is not None else x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_positions(tokens)
        for block in self.blocks:
            x = block(x, self.causal)
        return self.head(self.ln_out(x))

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position, the last block runs its query, projection and MLP
        at that position only (nothing else of it is read; at the zoo's prompt lengths they are
        most of a layer's FLOPs). Unmasked, the query sees the whole prompt; masked, the tokens
        after it cannot matter and are dropped."""
        if self.readout.position is None:
            return super().predict(tokens)
        T = tokens.shape[1]
        if self.causal:
            tokens = tokens[:, : self.readout.query_end(T)]
        query = self.readout.position % tokens.shape[1]  # causal: the last of the tokens kept
        x = self.embed_positions(tokens)  # (B, T', w)
        for block in self.blocks[:-1]:
            x = block(x, self.causal)
        if query != x.shape[1] - 1:  # unmasked, a query before the end: move it last (attention ignores order)
            x = torch.cat([x[:, :query], x[:, query + 1 :], x[:, query : query + 1]], dim=1)
        last = self.blocks[-1].forward_last(x)  # (B, w)
        return self.readout.channels(self.head(self.ln_out(last)))  # (B, d_y)


# ---------------------------------------------------------------------------- the family
class TransformerArch(Strict):
    type: Literal["softmax_transformer"]
    width: int = Field(64, gt=0)  # model width ("64 units")
    n_layers: int = Field(1, ge=1)
    heads: int = Field(1, ge=1)
    mlp: bool = True  # a GELU MLP after each attention
    causal: bool = False  # the regression prompt is unmasked in the blogpost setting
    positions: bool = True  # a learned position table P; without it (and unmasked) the model sees the prompt as a set
    max_len: int = Field(256, gt=0)  # the position table's rows: the longest prompt it reads (none without a table)


def build(arch: TransformerArch, task) -> SoftmaxTransformer:
    return SoftmaxTransformer(
        d_in=task.token_dim, d_out=task.d_out, readout=task.readout, width=arch.width, n_layers=arch.n_layers,
        heads=arch.heads, mlp=arch.mlp, causal=arch.causal, positions=arch.positions, max_len=arch.max_len,
    )


def _table_rows(arch: TransformerArch) -> tuple[str, int] | None:
    return ("max_len", arch.max_len) if arch.positions else None


FAMILY = Family(
    name="softmax_transformer",
    arch=TransformerArch,
    build=build,
    token_limit=_table_rows,
    card="""
A GPT-2-style softmax transformer (pre-norm blocks, learned positions unless `positions=False`,
no causal mask on the regression prompt), the blogpost's baseline: its memory grows with the prompt, so it has no
recurrent form and no step graph.
""",
)
