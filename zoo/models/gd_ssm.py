"""GD-SSM (Sushma, Tian et al. 2024): a diagonal linear SSM with a matrix-valued state, fed by
local self-attention, whose output applies the accumulated gradient to the query.

Every position t sees the window of the last w tokens (zeros before the start) and a constant:

    c_t = [s_{t−w+1}, …, s_t, 1] ∈ R^{w f + 1}

Layer l keeps two diagonal linear recurrences with 2-D states (the paper's two heads, A.2):

    Z_l,t = Λ_l ⊙ Z_l,t−1 + (A_l c_t)(B_l c_t)ᵀ        (m_v × m_k)   accumulates Σ y xᵀ
    Z̃_l,t = Λ̃_l ⊙ Z̃_l,t−1 + (Ã_l c_t)(B̃_l c_t)ᵀ        (m_k × m_k)   accumulates Σ x xᵀ (l ≥ 2)

(A c)(B c)ᵀ is the paper's local self-attention C_t Q C_tᵀ with a rank-one Q and learned
projections of the window.) The implicit regression weights after l GD steps are

    M_0 = 0,   M_l = M_{l−1} + β_l (Z_l − M_{l−1} Z̃_l − ρ M_{l−1})                  (A.2, A.4)

the gradient of ½ Σ‖y − M x‖² + (ρ/2)‖M‖² being −(Z − M Z̃) + ρ M; the output applies them
to the query with an input-dependent multiplicative read-out (Eq. 16 / Eq. 18):

    o_t = D ((M_L (Q c_t)) ⊙ (R c_t))

Λ = exp(−exp(ν)) ∈ [0, 1] entrywise; the constructions use ν = −∞ (Λ = 1, a perfect sum).
The first layer has no Z̃ head since M_0 = 0. With the "products" token layout (1-D
regression on c_t = (x_t y_t, x_{t+1}), w = 1) Eqs. 14–16 are m_v = f, m_k = 1; with the
"interleaved" layout (x_1, y_1, x_2, …, x_q in disjoint channels, w = 3) Eqs. 17–18 are
m_v = d_y, m_k = d_x. See zoo/constructions/gd_ssm.py.

Non-linear regression (A.3, Figure 4B): `embed` first maps each token linearly to `embed`
channels (the paper's input embedding), and `mlp` adds a residual weighted-sigmoid gated unit
(Tanaka 2020, as in S5) on the read-out before D:

    y ← y + W₂ (u ⊙ σ(W₃ u + b₃)),   u = GELU(W₁ y + b₁)

Glossary (code → paper): `window` = the sliding-window size (3); `a, b` = A, B (the value
and key projections of C_t); `a_tilde, b_tilde` = Ã, B̃; `nu, nu_tilde` = ν, ν̃ of Λ, Λ̃;
`beta` = β = −η/N of Eq. 13 (here +η in the zoo's sum convention, sign folded into Z);
`ridge` = ρ (A.4); `q, r, d` = Q (the C_t q of Eq. 18), R (Θ of Eq. 13), D; M = W_l of A.2.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import ZooModel
from zoo.models.scan import last_state, scan, with_history
from zoo.tasks.regression import Readout


def _nu_from_lambda(shape, lambda_range: tuple[float, float]) -> torch.Tensor:
    lam = torch.empty(shape).uniform_(*lambda_range).clamp(1e-4, 1 - 1e-4)
    return torch.log(-torch.log(lam))


class GDSSMLayer(nn.Module):
    def __init__(self, c_dim: int, value_dim: int, key_dim: int, second_head: bool, init_std: float,
                 lambda_range: tuple[float, float], beta_init: float = 0.1):
        super().__init__()
        self.a = nn.Parameter(torch.randn(value_dim, c_dim) * init_std)
        self.b = nn.Parameter(torch.randn(key_dim, c_dim) * init_std)
        self.nu = nn.Parameter(_nu_from_lambda((value_dim, key_dim), lambda_range))
        self.beta = nn.Parameter(torch.tensor(float(beta_init)))
        self.second_head = second_head
        if second_head:
            self.a_tilde = nn.Parameter(torch.randn(key_dim, c_dim) * init_std)
            self.b_tilde = nn.Parameter(torch.randn(key_dim, c_dim) * init_std)
            self.nu_tilde = nn.Parameter(_nu_from_lambda((key_dim, key_dim), lambda_range))

    @staticmethod
    def _outer(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return left.unsqueeze(-1) * right.unsqueeze(-2)  # (..., m, n)

    def inputs(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The recurrences' inputs (A c)(B c)ᵀ and (Ã c)(B̃ c)ᵀ for windows c (..., w f + 1)."""
        u = self._outer(c @ self.a.T, c @ self.b.T)
        u_tilde = self._outer(c @ self.a_tilde.T, c @ self.b_tilde.T) if self.second_head else None
        return u, u_tilde

    def gd_update(self, m: torch.Tensor | None, z: torch.Tensor, z_tilde: torch.Tensor | None, ridge: float) -> torch.Tensor:
        """M_l from M_{l−1} (None for M_0 = 0) and this layer's states."""
        if m is None:
            return self.beta * z
        return m + self.beta * (z - m @ z_tilde - ridge * m)


class WeightedSigmoidGatedUnit(nn.Module):
    """y + W₂ (u ⊙ σ(W₃ u + b₃)), u = GELU(W₁ y + b₁): a residual channel-mixing non-linearity."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.inner = nn.Linear(width, hidden)  # W₁, b₁
        self.gate = nn.Linear(hidden, hidden)  # W₃, b₃
        self.outer = nn.Linear(hidden, width, bias=False)  # W₂
        nn.init.zeros_(self.outer.weight)  # starts as the identity: the linear GD-SSM

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        u = torch.nn.functional.gelu(self.inner(y))
        return y + self.outer(u * torch.sigmoid(self.gate(u)))


class GDSSM(ZooModel):
    def __init__(self, d_in: int, d_out: int, readout: Readout, *, n_layers: int = 1, window: int = 3,
                 value_dim: int, key_dim: int, ridge: float = 0.0, init_std: float | None = None,
                 lambda_range: tuple[float, float] = (0.9, 0.999), beta_init: float = 0.1, zero_output: bool = False,
                 embed: int | None = None, mlp: int | None = None):
        super().__init__(d_in=d_in, d_out=d_out, readout=readout)
        self.window = window
        self.ridge = ridge
        self.value_dim, self.key_dim = value_dim, key_dim
        self.embed = nn.Linear(d_in, embed) if embed else None
        self.feature_dim = embed or d_in  # f: channels per token the windows see
        self.mlp = WeightedSigmoidGatedUnit(value_dim, mlp) if mlp else None
        self.compile_pays = mlp is None  # with the gated unit, inductor's CPU backward measured 0.7× eager
        c_dim = window * self.feature_dim + 1
        std = init_std or c_dim**-0.5
        self.layers = nn.ModuleList(
            GDSSMLayer(c_dim, value_dim, key_dim, second_head=i > 0, init_std=std, lambda_range=lambda_range,
                       beta_init=beta_init)
            for i in range(n_layers)
        )
        self.q = nn.Parameter(torch.randn(key_dim, c_dim) * std)
        self.r = nn.Parameter(torch.randn(value_dim, c_dim) * std)
        d = torch.randn(d_out, value_dim) * value_dim**-0.5  # drawn either way: the seed's other weights stay put
        self.d = nn.Parameter(d.zero_() if zero_output else d)

    def recurrent_parameter_names(self) -> set[str]:
        """ν, ν̃: trained with their own learning rate and no weight decay (paper, A.5)."""
        return {n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in ("nu", "nu_tilde")}

    def no_weight_decay(self) -> set[str]:
        return self.recurrent_parameter_names()

    # ------------------------------------------------------------------ shared pieces
    def _with_constant(self, window: torch.Tensor) -> torch.Tensor:
        return torch.cat([window, torch.ones_like(window[..., :1])], dim=-1)

    def _features(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens) if self.embed is not None else tokens

    def windows(self, tokens: torch.Tensor, history: torch.Tensor | None = None):
        """c_t for every t: (B, T, d_in) → (B, T, w f + 1), the w − 1 features before the first token
        taken from `history` (B, w − 1, f) (None: zeros); also returns the last w − 1 features."""
        tokens = self._features(tokens)  # (B, T, f)
        B, T, f = tokens.shape
        if history is None:
            history = tokens.new_zeros(B, self.window - 1, f)
        padded, history = with_history(history, tokens)  # (B, T+w−1, f)
        slots = [padded[:, k : k + T] for k in range(self.window)]  # oldest first
        return self._with_constant(torch.cat(slots, dim=-1)), history

    def _output(self, m: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        query = (m @ (c @ self.q.T).unsqueeze(-1)).squeeze(-1)  # (..., m_v)
        y = query * (c @ self.r.T)  # (..., m_v)
        if self.mlp is not None:
            y = self.mlp(y)
        return y @ self.d.T  # (..., d_out)

    @staticmethod
    def _lam(nu: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.exp(nu))

    # ------------------------------------------------------------------ sequence form
    def forward(self, tokens: torch.Tensor, *, parallel: bool | None = None) -> torch.Tensor:
        return self.forward_chunk(tokens, None, parallel=parallel)[0]

    def forward_chunk(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None, *, parallel: bool | None = None):
        """`parallel`: force the parallel (True) or sequential (False) scan; None: `scan` picks."""
        m, c, new_state = self._memory(tokens, state, parallel)
        return self._output(m, c), new_state  # (B, T, d_out)

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position q, every layer's M is needed there only (the GD
        update is position-wise): each Z_q is one weighted sum Σ_t λ^{q−t} ⊙ U_t instead of a
        scan, and the output (and the gated unit) runs at q only."""
        if self.readout.position is None:
            return super().predict(tokens)
        end = self.readout.query_end(tokens.shape[1])
        m, c, _ = self._memory(tokens[:, :end], None, None, last_only=True)  # (B, m_v, m_k), (B, w f + 1)
        return self.readout.channels(self._output(m, c))  # (B, d_y)

    def _memory(self, tokens: torch.Tensor, state: tuple[torch.Tensor, ...] | None, parallel: bool | None,
                last_only: bool = False):
        """M_L at every position (B, T, m_v, m_k), the windows c (B, T, w f + 1) and the state after the
        last token; `last_only` (from the zero state): M_L and c at the last position only, no state."""
        state = list(state) if state is not None else None
        history = state.pop(0) if state is not None and self.window > 1 else None
        c, history = self.windows(tokens, history)  # (B, T, w f + 1), (B, w − 1, f)
        new_state = [history] if self.window > 1 else []

        def run(nu, u):  # Z_t from the stored Z_0 (or zeros): (B, T, m, n); last_only: Z_T (B, m, n)
            if last_only:
                return last_state(self._lam(nu).to(u.dtype), u)
            z0 = state.pop(0).flatten(1) if state is not None else None
            z = scan(self._lam(nu).to(u.dtype).flatten(), u.flatten(2), h0=z0, parallel=parallel).view_as(u)
            new_state.append(z[:, -1])
            return z

        if last_only:
            c_all, c = c, c[:, -1]

        m = None
        for layer in self.layers:
            u, u_tilde = layer.inputs(c_all if last_only else c)  # (B, T, m_v, m_k), (B, T, m_k, m_k)
            z = run(layer.nu, u)
            z_tilde = run(layer.nu_tilde, u_tilde) if u_tilde is not None else None
            m = layer.gd_update(m, z, z_tilde, self.ridge)  # (B, T, m_v, m_k), or (B, m_v, m_k) last_only
        return m, c, tuple(new_state)

    # ------------------------------------------------------------------ recurrence
    def state_names(self) -> list[str]:
        names = ["window"] if self.window > 1 else []
        for i, layer in enumerate(self.layers):
            names.append(f"{i}.z")
            if layer.second_head:
                names.append(f"{i}.z_tilde")
        return names

    def init_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        p = self._param_like()
        state = [p.new_zeros(batch, self.window - 1, self.feature_dim)] if self.window > 1 else []
        for layer in self.layers:
            state.append(p.new_zeros(batch, self.value_dim, self.key_dim))
            if layer.second_head:
                state.append(p.new_zeros(batch, self.key_dim, self.key_dim))
        return tuple(state)

    def step(self, token: torch.Tensor, state: tuple[torch.Tensor, ...]):
        token = self._features(token)  # (B, f)
        state = list(state)
        new_state = []
        if self.window > 1:
            previous = state.pop(0)  # (B, w−1, f): the last w−1 tokens, oldest first
            window = torch.cat([previous, token.unsqueeze(1)], dim=1)  # (B, w, f)
            new_state.append(window[:, 1:])
            c = self._with_constant(window.flatten(1))
        else:
            c = self._with_constant(token)
        m = None
        for layer in self.layers:
            u, u_tilde = layer.inputs(c)
            z = self._lam(layer.nu) * state.pop(0) + u
            new_state.append(z)
            z_tilde = None
            if layer.second_head:
                z_tilde = self._lam(layer.nu_tilde) * state.pop(0) + u_tilde
                new_state.append(z_tilde)
            m = layer.gd_update(m, z, z_tilde, self.ridge)
        return self._output(m, c), tuple(new_state)
