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

With `positions=P` every token t < P also gets P one-hot position channels before the first layer (1 in
channel t, after the constant channel; dropped from the output). For the first layer M·[e; onehot(t)] =
M_e e + M[:, t] for each of W_Q, W_K, W_V: a learned absolute position table added to its queries, keys
and values, so its scores gain a learned term A[t, s] of the two positions, which lets it attend by
position (e.g. a y token to the x token just before it, which the interleaved layout needs and no
token-only score can do). Later layers see the position channels as the residual stream carries them
(the one-hot plus what earlier updates wrote there); without the residual, only what the layer before
wrote. A prompt longer than P tokens is refused, and an entry whose task's prompts are longer is refused
when it is validated (`length_problem`). With positions the model is read as a sequence: no step or chunk
form (a stream would have to count its tokens, and ends at P).

Glossary: d = d_x + d_y (token width); W_Q, W_K, W_V, W_P are `w_q, w_k, w_v, w_p`;
λ is `damping`; K is `loops`; e are `tokens`; P is `positions`.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, GDRate, NotRecurrentError, WeightsFigure, ZooModel
from zoo.science.schema import Strict
from zoo.science.tasks.regression import LinearRegressionTask, Readout, TaskBatch, gd_predict, resolve_eta

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
        positions: int = 0,
    ):
        super().__init__(d_in=d, d_out=d, readout=readout)
        self.constant = constant
        self.positions = positions
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.attention = attention
        self.loops = loops
        self.damping = damping
        self.recurrent = attention != "context" and not positions
        self.residual = residual
        self.layers = nn.ModuleList(LSALayer(d + constant + positions, init_std) for _ in range(n_layers))

    @property
    def max_tokens(self) -> int | None:
        return self.positions or None  # the position table's rows

    def _in(self, tokens: torch.Tensor) -> torch.Tensor:
        """(…, T, d) → (…, T, d + constant + P): the constant channel and the one-hot positions, where the
        model has them."""
        parts = [tokens]
        if self.constant:
            parts.append(torch.ones_like(tokens[..., :1]))
        if self.positions:
            T = tokens.shape[-2]
            if T > self.positions:
                raise ValueError(f"a prompt of {T} tokens is longer than the model's {self.positions} positions")
            onehot = torch.eye(self.positions, dtype=tokens.dtype, device=tokens.device)[:T]  # (T, P)
            parts.append(onehot.expand(*tokens.shape[:-1], self.positions))
        return torch.cat(parts, dim=-1) if len(parts) > 1 else tokens

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

    def predict(self, tokens: torch.Tensor) -> torch.Tensor:
        """The read-out. With one query position, the last applied layer runs at that position only,
        and forms no token's key or value: its query q reads the keys and values through two sums,

            Σ_s (k_s·q) v_s = W_V Σ_s (e_sᵀ W_Kᵀ q) e_s   (s over the query's key set),

        B·d² FLOPs for W_Kᵀ q and for W_V's product instead of B·T·d² each, and no (T, T) scores.
        The layers before it run in full (the last one reads every token they output)."""
        position = self.readout.position
        if position is None:
            return super().predict(tokens)
        e = self._in(tokens)  # (B, T, d)
        T = e.shape[1]
        mask = self._mask(T, e)
        layers = list(self._applied_layers())
        for layer in layers[:-1]:
            update = self.damping * layer.attend(e, mask, None)[0]
            e = e + update if self.residual else update
        last, query = layers[-1], position % T
        e_q = e[:, query]  # (B, d)
        u = (e_q @ last.w_q.T) @ last.w_k  # W_Kᵀ q (B, d)
        scores = (e @ u.unsqueeze(2)).squeeze(2) * mask[query]  # (B, T): k_s·q on the query's key set
        read = (scores.unsqueeze(1) @ e).squeeze(1) @ last.w_v.T  # Σ_s (k_s·q) v_s  (B, d)
        update = self.damping * (read @ last.w_p.T)
        return self.readout.channels(self._out(e_q + update if self.residual else update))  # (B, d_y)

    def has_polynomial_map(self) -> bool:
        # the instantaneous polynomial reads bare tokens: no constant channel, no positions (a map per token)
        return len(self.layers) == 1 and self.loops == 1 and not self.constant and not self.positions

    def instantaneous(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's polynomial kernel W_P (W_V x)(W_K x)ᵀ(W_Q x) for single tokens x (…, d)."""
        if len(self.layers) != 1 or self.loops != 1 or self.constant or self.positions:
            raise ValueError("the instantaneous polynomial is defined for one LSA layer without a constant channel "
                             "or positions")
        layer = self.layers[0]
        q, k, v = x @ layer.w_q.T, x @ layer.w_k.T, x @ layer.w_v.T
        return ((k * q).sum(-1, keepdim=True) * v) @ layer.w_p.T

    # ---------------------------------------------------------------- recurrence
    def state_shapes(self):
        self._require_recurrent()
        d = self.d_in + self.constant
        return [(f"{i}.kv", (d, d)) for i in range(len(self.layers) * self.loops)]  # S = Σ v kᵀ per applied layer

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
        if self.positions:
            raise NotRecurrentError(
                f"an LSA with {self.positions} one-hot positions is read as a sequence of at most that many tokens; "
                "it has no step form. Export its sequence graph."
            )
        if not self.recurrent:
            raise NotRecurrentError(
                "attention='context' lets every token see all context tokens, including later ones; "
                "it has no causal recurrence. Use 'strict_causal' (same query prediction for one layer)."
            )


# ---------------------------------------------------------------------------- θ_GD
# For tokens e = (x, y) ∈ R^{d_x + d_y} (von Oswald et al., Proposition 1):
#
#     W_K = W_Q = [[I_{d_x}, 0], [0, 0]]     (keys and queries read x only)
#     W_V       = [[0, 0], [W_0, −I_{d_y}]]  (values carry the residual W_0 x − y)
#     W_P       = η · I                       (η in the zoo's sum convention = η_blog / C)
#
# so the query token (x_q, 0) leaves the layer as (x_q, −(W_0 + η Σ_i (y_i − W_0 x_i) x_iᵀ) x_q):
# minus the one-step-GD prediction, which is why the task's read-out sign is −1. Context tokens
# leave as (x_i, y_i − W_1 x_i), the residuals of the updated model, so stacking L such layers
# with W_0 = 0 (attention over the context, query excluded) is L steps of GD.
def gd_lsa_weights(d_x: int, d_y: int, eta: float, w0: torch.Tensor | None = None, dtype=torch.float64):
    d = d_x + d_y
    w_kq = torch.zeros(d, d, dtype=dtype)
    w_kq[:d_x, :d_x] = torch.eye(d_x, dtype=dtype)
    w_v = torch.zeros(d, d, dtype=dtype)
    if w0 is not None:
        w_v[d_x:, :d_x] = w0.to(dtype)
    w_v[d_x:, d_x:] = -torch.eye(d_y, dtype=dtype)
    w_p = eta * torch.eye(d, dtype=dtype)
    return {"w_q": w_kq, "w_k": w_kq.clone(), "w_v": w_v, "w_p": w_p}


@torch.no_grad()
def construct_gd_lsa(model: LinearSelfAttention, d_x: int, eta: float) -> LinearSelfAttention:
    """Set every layer of `model` to θ_GD with learning rate η (multi-layer: one GD step each)."""
    d_y = model.d_in - d_x
    weights = gd_lsa_weights(d_x, d_y, eta)
    for layer in model.layers:
        for name, value in weights.items():
            getattr(layer, name).copy_(value)
    return model


def lsa_weights(lsa: LinearSelfAttention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_P W_V, W_K, W_Q) of a one-layer causal LSA without residual (Zucchet et al. Eq. 1, W_P folded into W_V)."""
    if len(lsa.layers) != 1 or lsa.loops != 1 or lsa.attention != "causal" or lsa.residual:
        raise ValueError("a gated RNN implements one causal LSA layer without residual (Zucchet et al. Eq. 1)")
    layer = lsa.layers[0]
    return layer.w_p @ layer.w_v, layer.w_k, layer.w_q


def teacher_lsa(task, dtype=torch.float64) -> LinearSelfAttention:
    """The teacher of an lsa_teacher task as a zoo LSA module (causal, no residual, W_P = I)."""
    model = LinearSelfAttention(task.d, task.readout, attention="causal", residual=False).to(dtype)
    with torch.no_grad():
        layer = model.layers[0]
        for name, value in task.teacher_weights(dtype).items():
            getattr(layer, name).copy_(value)
        layer.w_p.copy_(torch.eye(task.d, dtype=dtype))
    return model.requires_grad_(False)


class ImplementedLSA(GDRate):
    """The knobs of a construction that implements an LSA layer (`implemented_lsa`): which one, and θ_GD's η."""

    lsa: Literal["gd", "teacher"] = "gd"  # θ_GD (at `eta`) or the lsa_teacher task's teacher


def implemented_lsa(task, source, validation_batch=None) -> tuple[tuple[torch.Tensor, ...], dict]:
    """(W_P W_V, W_K, W_Q) in float64 of the LSA layer a recurrent construction implements
    (`source.lsa`: θ_GD at the entry's η, or the task's teacher), and what to record of it."""
    if source.lsa == "teacher":
        w = task.teacher_weights(torch.float64)
        return (w["w_v"], w["w_k"], w["w_q"]), {"lsa": "teacher"}  # W_P = I
    eta = resolve_eta(source.eta, task, 1, validation_batch)
    w = gd_lsa_weights(task.d_x, task.token_dim - task.d_x, eta)
    return (w["w_p"] @ w["w_v"], w["w_k"], w["w_q"]), {"lsa": "gd", "eta": eta}


def lsa_width(task) -> int:
    """d, the token width of the LSA layer a recurrent construction implements on `task`."""
    return task.d if task.kind == "lsa_teacher" else task.d_x + task.d_y


def lsa_problem(task, source) -> str | None:
    """Why the LSA a recurrent construction implements (`source.lsa`) does not exist for `task`."""
    if source.lsa == "teacher" and task.kind != "lsa_teacher":
        return "lsa = 'teacher' needs an lsa_teacher task"
    if source.lsa == "gd" and (task.kind != "linear_regression" or task.layout != "pairs"):
        return "lsa = 'gd' needs a linear_regression task with layout 'pairs'"
    return None


def lsa_matrices(model: LinearSelfAttention) -> dict[str, torch.Tensor]:
    """The products that identify θ_GD up to symmetry (von Oswald et al. Fig. 2): W_KᵀW_Q and W_P W_V."""
    out = {}
    for i, layer in enumerate(model.layers):
        out[f"layer {i}: W_Kᵀ W_Q"] = layer.w_k.T @ layer.w_q
        out[f"layer {i}: W_P W_V"] = layer.w_p @ layer.w_v
    return out


# ---------------------------------------------------------------------------- the family
class LSAArch(Strict):
    type: Literal["lsa"]
    n_layers: int = Field(1, ge=1)  # distinct LSA layers
    attention: Literal["causal", "strict_causal", "context"] = "strict_causal"  # key set, see the header
    loops: int = Field(1, ge=1)  # apply the layer stack K times (looped LSA)
    damping: float = Field(1.0, ge=0)  # λ scaling every update (looped LSA needs ≈0.7–0.75)
    init_std: float = Field(0.02, gt=0)  # N(0, init_std²) for every weight
    residual: bool = True  # e ← e + update (von Oswald); False: e ← update (Zucchet Eq. 1)
    constant: bool = False  # append a channel fixed at 1 to every token: affine keys/values/queries
    # P one-hot position channels before the first layer (a learned position table), at least the task's tokens; 0: none.
    # At most 1,024: the layers' width grows with P (4 (d + 1 + P)² weights a layer)
    positions: int = Field(0, ge=0, le=1024)


def build(arch: LSAArch, task) -> LinearSelfAttention:
    return LinearSelfAttention(
        d=task.token_dim, readout=task.readout, n_layers=arch.n_layers, attention=arch.attention,
        loops=arch.loops, damping=arch.damping, init_std=arch.init_std, residual=arch.residual,
        constant=arch.constant, positions=arch.positions,
    )


def _gd_problem(arch: LSAArch, task, source) -> str | None:
    if task.kind != "linear_regression" or task.layout != "pairs":
        return "'gd' needs arch type 'lsa' on a linear_regression task with layout 'pairs'"
    if arch.constant or arch.positions:
        return "'gd' sets the weights of tokens (x, y): it needs constant = false and positions = 0"
    return None


def _apply_gd(model: LinearSelfAttention, task, source, validation_batch=None) -> dict:
    n_steps = len(model.layers) * model.loops
    eta = resolve_eta(source.eta, task, n_steps, validation_batch)
    construct_gd_lsa(model, task.d_x, eta / model.damping)
    return {"eta": eta, "gd_steps": n_steps}


def loop_curve(model, task: LinearRegressionTask, batch: TaskBatch, loops: list[int], dampings: list[float], *,
               eta: float | None = None, zero_x_updates: bool = False) -> list[dict]:
    """The blogpost's Figure 13: a one-layer LSA applied K times, e ← e + λ·layer(e), against K
    steps of GD at rate λη* (what K loops of θ_GD compute exactly).

    Looping uses context attention (every token attends to the context tokens, the query to
    none of itself): for one application it gives the query the same prediction as the causal
    modes, and under it K layers of θ_GD are K steps of GD (von Oswald et al.). Without
    dampening the trained layer's η ≈ η* is too large to iterate and the loss grows with K.

    `zero_x_updates`: first zero the rows of W_P that write the tokens' x-part. One application
    never reads them (the read-out takes the query's y-part), so training leaves them at whatever
    they drifted to; θ_GD has them zero. Looped, they corrupt the inputs and the loss explodes
    whatever λ; zeroed, the trained layer iterates like GD."""
    if not (isinstance(model, LinearSelfAttention) and model.has_polynomial_map()) or task.layout != "pairs":
        raise ValueError("loop curves take a one-layer, unlooped LSA on (x, y) pairs (e.g. lsa-d10-c10 or lsa-gd-d10-c10)")
    eta = task.analytic_eta() if eta is None else eta
    param = next(model.parameters())
    if zero_x_updates:
        model = copy.deepcopy(model)
        with torch.no_grad():
            model.layers[0].w_p[: task.d_x] = 0
    rows = []
    for damping in dampings:
        for k in loops:
            looped = copy.deepcopy(model)
            looped.loops, looped.damping, looped.attention = k, model.damping * damping, "context"
            with torch.no_grad():
                pred = looped.predict(batch.tokens.to(param)).double()
            rows.append({"loops": k, "damping": damping, "test_loss": task.loss(pred, batch.targets).item(),
                         "gd_loss": task.loss(gd_predict(batch, damping * eta, k), batch.targets).item()})
    return rows


def _position_rows(arch: LSAArch) -> tuple[str, int] | None:
    return ("positions", arch.positions) if arch.positions else None


FAMILY = Family(
    name="lsa",
    arch=LSAArch,
    build=build,
    constructions={"gd": ConstructionRule(_gd_problem, _apply_gd, "θ_GD: each layer (each loop) one GD step at η",
                                          knobs=GDRate)},
    weights=WeightsFigure(lsa_matrices, "weight products", "W_K^T W_Q and W_P W_V of every layer"),
    token_limit=_position_rows,
    card="""
Linear self-attention (single head, no softmax, no normalisation, residual) on tokens
e_i = (x_i, y_i) and the query (x_q, 0). With W_K = W_Q = [[I,0],[0,0]], W_V = [[0,0],[W_0,−I]]
and W_P = η·I, one layer moves the query to (x_q, −ŷ_GD): exactly one step of gradient descent on
the in-context least-squares loss (von Oswald et al. 2023, Proposition 1). Trained from a random
initialisation on fresh tasks, one layer converges to the same function.
""",
)
