"""Linear self-attention (von Oswald et al. 2023; the ICLR 2024 blogpost; Zucchet et al. Eq. 1).

One layer, single head, no softmax, no normalisation, residual:

    k_s = W_K e_s,  q_t = W_Q e_t,  v_s = W_V e_s
    e_t ← e_t + λ · W_P Σ_{s ∈ S(t)} v_s (k_sᵀ q_t)                                  (1)

with λ = 1 except in the looped model (one layer applied K times, dampening λ). Without the
residual (`residual=False`, Zucchet et al.'s Eq. 1 with W_P folded into W_V) e_t is replaced.
The key set S(t) is the `attention` mode:
    "causal"         S(t) = {s ≤ t}       Zucchet et al.'s LSA (the one gated RNNs implement)
    "strict_causal"  S(t) = {s < t}       von Oswald et al. for one layer: the query is never a key
    "context"        S(t) = {s < T−1}     von Oswald et al.: every token sees all context tokens,
                                          the query (last token) is never a key; needed for
                                          multi-layer LSA = multi-step GD; not a recurrence.

Recurrent form (the two causal modes): with S_t = Σ_{s∈S(t)} v_s k_sᵀ ∈ R^{d×d},
    causal:         S_t = S_{t−1} + v_t k_tᵀ ;  out_t = e_t + W_P S_t q_t
    strict_causal:  out_t = e_t + W_P S_{t−1} q_t ;  S_t = S_{t−1} + v_t k_tᵀ
so memory is one d×d matrix per layer, whatever the stream length.

With `constant=True` every token gets an extra channel fixed at 1 before the first layer (dropped
from the output): keys, values and queries become affine in the token, as with the biases or the
input embedding of a standard transformer (the papers do not say whether their linear
transformers have either). Without it a layer is odd in the tokens, f(−e) = −f(e),
which on the GD-SSM token layouts (where flipping x and W flips every token but not the target)
cannot beat the zero predictor.

Glossary: d = d_x + d_y (token width); W_Q, W_K, W_V, W_P are `w_q, w_k, w_v, w_p`;
λ is `damping`; K is `loops`; e are `tokens`.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import NotRecurrentError, ZooModel
from zoo.tasks.regression import Readout

ATTENTION_MODES = ("causal", "strict_causal", "context")


class LSALayer(nn.Module):
    def __init__(self, d: int, init_std: float):
        super().__init__()
        self.w_q = nn.Parameter(torch.randn(d, d) * init_std)
        self.w_k = nn.Parameter(torch.randn(d, d) * init_std)
        self.w_v = nn.Parameter(torch.randn(d, d) * init_std)
        self.w_p = nn.Parameter(torch.randn(d, d) * init_std)

    def attend(self, e: torch.Tensor, mask: torch.Tensor, kv: torch.Tensor | None = None):
        """W_P (S_0 + Σ_s v_s k_sᵀ) q_t for every t, keys restricted by `mask` (T, T), where S_0 = `kv`
        (B, d, d) sums the keys of earlier chunks (None: none); also returns S_0 + Σ_t v_t k_tᵀ."""
        q, k, v = e @ self.w_q.T, e @ self.w_k.T, e @ self.w_v.T  # (B, T, d)
        scores = (q @ k.transpose(1, 2)) * mask  # (B, T, T): [t, s] = k_sᵀ q_t
        read = scores @ v  # (B, T, d)
        chunk_kv = v.transpose(1, 2) @ k  # (B, d, d): Σ_t v_t k_tᵀ
        if kv is not None:
            read = read + q @ kv.transpose(1, 2)
            chunk_kv = kv + chunk_kv
        return read @ self.w_p.T, chunk_kv  # (B, T, d), (B, d, d)

    def step(self, e: torch.Tensor, kv: torch.Tensor, strict: bool):
        """One token e (B, d) with state kv = Σ v kᵀ (B, d, d)."""
        q, k, v = e @ self.w_q.T, e @ self.w_k.T, e @ self.w_v.T  # (B, d)
        new_kv = kv + v.unsqueeze(2) * k.unsqueeze(1)
        read = kv if strict else new_kv
        return (read @ q.unsqueeze(2)).squeeze(2) @ self.w_p.T, new_kv


class LinearSelfAttention(ZooModel):
    chunk_len = 256  # a chunk attends within itself through a (T, T) mask: keep it small
    def __init__(
        self,
        d: int,
        readout: Readout,
        n_layers: int = 1,
        attention: str = "strict_causal",
        loops: int = 1,
        damping: float = 1.0,
        init_std: float = 0.02,
        residual: bool = True,
        constant: bool = False,
    ):
        super().__init__(d_in=d, d_out=d, readout=readout)
        self.constant = constant
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.attention = attention
        self.loops = loops
        self.damping = damping
        self.recurrent = attention != "context"
        self.residual = residual
        self.layers = nn.ModuleList(LSALayer(d + constant, init_std) for _ in range(n_layers))

    def _in(self, tokens: torch.Tensor) -> torch.Tensor:
        """(…, d) → (…, d + 1) with the constant channel, when the model has one."""
        return torch.cat([tokens, torch.ones_like(tokens[..., :1])], dim=-1) if self.constant else tokens

    def _out(self, e: torch.Tensor) -> torch.Tensor:
        return e[..., : self.d_out]

    def _mask(self, T: int, like: torch.Tensor) -> torch.Tensor:
        s = torch.arange(T, device=like.device)
        t = s.unsqueeze(1)
        if self.attention == "causal":
            keep = s <= t
        elif self.attention == "strict_causal":
            keep = s < t
        else:
            keep = (s < T - 1).expand(T, T)
        return keep.to(like.dtype)

    def _applied_layers(self):
        """The layer sequence in application order (looped: the same layers K times)."""
        for _ in range(self.loops):
            yield from self.layers

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._layers_from(tokens, None)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        self._require_recurrent()
        return self._layers_from(tokens, state)

    def _layers_from(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None):
        e = self._in(tokens)  # (B, T, d)
        mask = self._mask(e.shape[1], e)
        state = state or (None,) * (len(self.layers) * self.loops)
        new_state = []
        for layer, kv in zip(self._applied_layers(), state):
            update, kv = layer.attend(e, mask, kv)
            update = self.damping * update
            e = e + update if self.residual else update
            new_state.append(kv)
        return self._out(e), tuple(new_state)

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's polynomial kernel W_P (W_V x)(W_K x)ᵀ(W_Q x) for single tokens x (…, d)."""
        if len(self.layers) != 1 or self.loops != 1 or self.constant:
            raise ValueError("the instantaneous polynomial is defined for one LSA layer without a constant channel")
        layer = self.layers[0]
        q, k, v = x @ layer.w_q.T, x @ layer.w_k.T, x @ layer.w_v.T
        return ((k * q).sum(-1, keepdim=True) * v) @ layer.w_p.T

    # ---------------------------------------------------------------- recurrence
    def state_names(self) -> list[str]:
        self._require_recurrent()
        return [f"{i}.kv" for i in range(len(self.layers) * self.loops)]

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        self._require_recurrent()
        p, d = self._param_like(), self.d_in + self.constant
        return tuple(p.new_zeros(batch, d, d) for _ in range(len(self.layers) * self.loops))

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        self._require_recurrent()
        strict = self.attention == "strict_causal"
        e, new_state = self._in(token), []
        for layer, kv in zip(self._applied_layers(), state):
            delta, kv = layer.step(e, kv, strict)
            e = e + self.damping * delta if self.residual else self.damping * delta
            new_state.append(kv)
        return self._out(e), tuple(new_state)

    def _require_recurrent(self) -> None:
        if not self.recurrent:
            raise NotRecurrentError(
                "attention='context' lets every token see all context tokens, including later ones; "
                "it has no causal recurrence. Use 'strict_causal' (same query prediction for one layer)."
            )
