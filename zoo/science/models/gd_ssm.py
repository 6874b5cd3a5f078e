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
m_v = d_y, m_k = d_x (the defaults, `state_dims`). The construction is at the end of the file.

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

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, GDRate, WeightsFigure, ZooModel
from zoo.science.models.scan import last_state, scan, with_history
from zoo.science.schema import Strict
from zoo.science.tasks.regression import Readout, resolve_eta


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
    def state_shapes(self):
        shapes = [("window", (self.window - 1, self.feature_dim))] if self.window > 1 else []  # the last w−1 tokens
        for i, layer in enumerate(self.layers):
            shapes.append((f"{i}.z", (self.value_dim, self.key_dim)))  # Z_l ≈ Σ y xᵀ
            if layer.second_head:
                shapes.append((f"{i}.z_tilde", (self.key_dim, self.key_dim)))  # Z̃_l ≈ Σ x xᵀ
        return shapes

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


def state_dims(value_dim: int | None, key_dim: int | None, layout: str, d_x: int, d_y: int) -> tuple[int, int]:
    """(m_v, m_k) of the state Z: the config's, or, where unset, the task's — d_y × d_x for
    interleaved tokens, d_x × 1 for products (so a sweep over task.d_x needs no arch override)."""
    default = (d_x, 1) if layout == "products" else (d_y, d_x)
    return value_dim or default[0], key_dim or default[1]


# ---------------------------------------------------------------------------- the GD construction
# Window slots are numbered oldest first; slot k of c_t occupies channels [k f, (k+1) f) and
# the constant 1 is the last channel. With Λ = Λ̃ = 1 (ν = −∞) and β_l = η:
#
# "products" layout, c_t = (x_t y_t, x_{t+1}), one layer (Eqs. 14–16, Ψ and Θ):
#     A c = x_t y_t (Ψ),  B c = 1,  Q c = 1,  R c = x_{t+1} (Θ),  D = 1ᵀ
#     → z_t = Σ_{i≤t} x_i y_i,  o_t = η z_tᵀ x_{t+1}: one GD step from w = 0.
#
# "interleaved" layout, s = (x_1,0), (0,y_1), …, (x_q,0), window 3 (Eqs. 17–18, A.1–A.2):
#     at an x token the window is [x_j, y_j, x_{j+1}] (C_t of Eq. 21)
#     A c = y-channels of slot w−2 (y_j),  B c = x-channels of slot w−3 (x_j)   → Z = Σ y_j x_jᵀ
#     Ã c = B̃ c = x-channels of slot w−3                                        → Z̃ = Σ x_j x_jᵀ
#     Q c = x-channels of the current slot (x_{t+1}),  R c = 1,  D = I
# At a y token the middle slot is an x token whose y-channels are zero, and the oldest slot a
# y token whose x-channels are zero, so nothing spurious is accumulated. At the query,
# M_L = W_L of L GD steps on the whole context (with ridge ρ: A.4).
def shape_problem(model_dims: dict, layout: str, d_x: int, d_y: int) -> str | None:
    """Why the GD construction cannot apply (None when it can). `model_dims`: window, n_layers,
    value_dim, key_dim (None: the task's default), embed."""
    w, layers = model_dims["window"], model_dims["n_layers"]
    if model_dims.get("embed"):
        return "the GD construction reads the raw tokens: no input embedding (a gated unit on the read-out is left to training)"
    m_v, m_k = state_dims(model_dims["value_dim"], model_dims["key_dim"], layout, d_x, d_y)
    if layout == "products":
        if layers != 1:
            return "the 'products' layout has no room for Σ x xᵀ: one layer (one GD step) only"
        if (m_v, m_k) != (d_x, 1):
            return f"the 'products' layout needs value_dim = d_x = {d_x} and key_dim = 1"
    elif layout == "interleaved":
        if w < 3:
            return "the 'interleaved' layout needs window ≥ 3 (x_j, y_j, x_{j+1})"
        if (m_v, m_k) != (d_y, d_x):
            return f"the 'interleaved' layout needs value_dim = d_y = {d_y} and key_dim = d_x = {d_x}"
    else:
        return f"no GD-SSM construction for the {layout!r} layout (use 'products' or 'interleaved')"
    return None


@torch.no_grad()
def construct_gd_ssm(model: GDSSM, layout: str, d_x: int, d_y: int, eta: float) -> GDSSM:
    problem = shape_problem(
        {"window": model.window, "n_layers": len(model.layers), "value_dim": model.value_dim, "key_dim": model.key_dim,
         "embed": model.embed is not None},
        layout, d_x, d_y,
    )
    if problem:
        raise ValueError(problem)
    f, w = model.d_in, model.window
    const = w * f

    def slot(k: int, channel: int) -> int:
        return k * f + channel

    for name, p in model.named_parameters():
        if not name.startswith("mlp."):  # a gated unit on the read-out keeps its (identity) init, for training
            p.zero_()
    for layer in model.layers:
        layer.nu.fill_(-float("inf"))
        layer.beta.fill_(eta)
        if layer.second_head:
            layer.nu_tilde.fill_(-float("inf"))
    current = w - 1
    if layout == "products":
        layer = model.layers[0]
        for i in range(d_x):
            layer.a[i, slot(current, i)] = 1.0  # Ψ: x_t y_t
            model.r[i, slot(current, d_x + i)] = 1.0  # Θ: x_{t+1}
        layer.b[0, const] = 1.0
        model.q[0, const] = 1.0
        model.d.fill_(1.0)
    else:
        prev, prev2 = w - 2, w - 3
        for layer in model.layers:
            for i in range(d_y):
                layer.a[i, slot(prev, d_x + i)] = 1.0  # y_j
            for j in range(d_x):
                layer.b[j, slot(prev2, j)] = 1.0  # x_j
                if layer.second_head:
                    layer.a_tilde[j, slot(prev2, j)] = 1.0
                    layer.b_tilde[j, slot(prev2, j)] = 1.0
        for j in range(d_x):
            model.q[j, slot(current, j)] = 1.0  # x_{t+1}
        model.r[:, const] = 1.0
        model.d.copy_(torch.eye(d_y))
    return model


def gd_ssm_matrices(model: GDSSM) -> dict[str, torch.Tensor]:
    """What the GD-SSM construction fixes (Sushma, Tian et al. Fig. 3): the window projections
    feeding each state (β folded into A), the decays Λ, and the query / read-out projections."""
    out = {}
    for i, layer in enumerate(model.layers):
        out[f"layer {i}: β·A (values)"] = layer.beta * layer.a
        out[f"layer {i}: B (keys)"] = layer.b
        out[f"layer {i}: Λ"] = torch.exp(-torch.exp(layer.nu))
        if layer.second_head:
            out[f"layer {i}: Ã"] = layer.a_tilde
            out[f"layer {i}: B̃"] = layer.b_tilde
    out["Q (query)"] = model.q
    out["R (read-out gate)"] = model.r
    return out


# ---------------------------------------------------------------------------- the family
class GDSSMArch(Strict):
    type: Literal["gd_ssm"]
    n_layers: int = Field(1, ge=1)  # stacked GD-SSM layers (one GD step each when constructed)
    window: int = Field(3, ge=1)  # local self-attention window (3 for interleaved tokens, 1 for products)
    value_dim: int | None = Field(None, gt=0)  # m_v: rows of the state Z (default from the task: d_y; d_x for products)
    key_dim: int | None = Field(None, gt=0)  # m_k: columns of Z (default from the task: d_x; 1 for products)
    ridge: float = Field(0.0, ge=0)  # ρ of the L2-regularised implicit loss (A.4)
    init_std: float | None = Field(None, gt=0)  # default: 1/sqrt(w f + 1)
    lambda_range: tuple[float, float] = (0.9, 0.999)  # initial Λ ~ U(range)
    # The output is a degree-6 product of parameters; from a random init it falls to the zero predictor
    # first and must escape that saddle. β = 1 and D = 0 at init let it escape at f = 20 (reports/sushma-tian-2024/figure-1c.md).
    beta_init: float = Field(0.1, gt=0)  # initial β of every layer
    zero_output: bool = False  # D starts at 0: ŷ = 0 at init without shrinking the other five factors
    embed: int | None = Field(None, gt=0)  # A.3: linear token embedding to this many channels first
    mlp: int | None = Field(None, gt=0)  # A.3: hidden width of a weighted-sigmoid gated unit on the read-out


def build(arch: GDSSMArch, task) -> GDSSM:
    value_dim, key_dim = state_dims(arch.value_dim, arch.key_dim, getattr(task, "layout", None), task.d_x, task.d_y)
    return GDSSM(
        d_in=task.token_dim, d_out=task.d_out, readout=task.readout, n_layers=arch.n_layers, window=arch.window,
        value_dim=value_dim, key_dim=key_dim, ridge=arch.ridge, init_std=arch.init_std,
        lambda_range=arch.lambda_range, beta_init=arch.beta_init,
        zero_output=arch.zero_output, embed=arch.embed, mlp=arch.mlp,
    )


def _gd_ssm_problem(arch: GDSSMArch, task, source) -> str | None:
    if task.kind != "linear_regression":
        return "'gd_ssm' needs arch type 'gd_ssm' on a linear_regression task"
    return shape_problem(arch.model_dump(), task.layout, task.d_x, task.d_y)


def _apply_gd_ssm(model: GDSSM, task, source, validation_batch=None) -> dict:
    n_steps, ridge = len(model.layers), model.ridge
    eta = resolve_eta(source.eta, task, n_steps, validation_batch, ridge=ridge)
    construct_gd_ssm(model, task.layout, task.d_x, task.d_y, eta)
    return {"eta": eta, "gd_steps": n_steps, "ridge": ridge}


FAMILY = Family(
    name="gd_ssm",
    arch=GDSSMArch,
    build=build,
    constructions={"gd_ssm": ConstructionRule(_gd_ssm_problem, _apply_gd_ssm,
                                              "L layers = L steps of (ridge-regularised) GD at η", knobs=GDRate)},
    weights=WeightsFigure(gd_ssm_matrices, "window projections, Λ and read-out (cf. Sushma, Tian et al. Fig. 3)",
                          "A, B (Ã, B̃), Λ of every layer and the read-out Q, R"),
    gd_reference=lambda arch: (arch.n_layers, arch.ridge),  # one GD step per layer, with the layers' ridge
    card="""
GD-SSM (Sushma, Tian et al. 2024): local self-attention over a sliding window of 3 tokens feeds
a diagonal linear recurrence whose state is a matrix, Z_t = Λ ⊙ Z_{t−1} + (A c_t)(B c_t)ᵀ, and
the output applies the accumulated gradient to the query multiplicatively, o_t = D((M x_q) ⊙ R c_t).
With Λ = 1 the state is the in-context gradient Σ y xᵀ, so one layer is exactly one step of
gradient descent; stacking layers with a second head (Σ x xᵀ) gives multi-step GD, and an L2
term gives ridge-regularised GD (appendix A.2, A.4).
""",
)
