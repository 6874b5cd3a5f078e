"""Teacher–student (Zucchet et al. section 3): a student mimics a random linear self-attention
layer, output at every position, each sequence seen once.

    x_t ~ N(0, x_std² I_d),  W_V, W_K, W_Q ~ N(0, w_std²) (fixed by `teacher_seed`)
    y_t = Σ_{t' ≤ t} (W_V x_t')(W_K x_t')ᵀ (W_Q x_t)        (causal LSA, Eq. 1, no residual)
    loss = ½ · mean over sequences, positions and coordinates of (ŷ_t − y_t)²

The paper does not state the input and teacher distributions; these defaults keep y_t O(1)
over 32 steps and are declared in the registry entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from zoo.science.tasks.base import Task
from zoo.science.tasks.regression import Positive, PositiveFloat, Readout


@dataclass
class SequenceBatch:
    tokens: torch.Tensor  # (B, T, d)
    targets: torch.Tensor  # (B, T, d)

    @property
    def x(self) -> torch.Tensor:
        return self.tokens

    @property
    def y(self) -> torch.Tensor:
        return self.targets


@dataclass(frozen=True)
class LSATeacherTask(Task):
    """The task's parameters, declared once: a registry `[tasks.NAME]` of kind "lsa_teacher" holds exactly
    these fields (zoo.science.registry derives its schema from this class)."""

    kind: ClassVar[str] = "lsa_teacher"

    d: Positive  # token and output dimension
    seq_len: Positive = 32  # sequence length (every position is a target)
    teacher_seed: int = 0  # seed of the teacher's W_V, W_K, W_Q
    x_std: PositiveFloat = 1.0  # x_t ~ N(0, x_std² I)
    w_std: PositiveFloat = 0.5  # teacher weights ~ N(0, w_std²)

    @property
    def token_dim(self) -> int:
        return self.d

    @property
    def n_tokens(self) -> int:
        return self.seq_len

    @property
    def d_out(self) -> int:
        return self.d

    @property
    def readout(self) -> Readout:
        return Readout(position=None, start=0, stop=self.d, sign=1.0)

    @property
    def predicts_every_position(self) -> bool:
        return True

    @property
    def prediction_dim(self) -> int:
        return self.d

    @property
    def token_layout(self) -> dict:
        """How a dataset row becomes tokens (see LinearRegressionTask.token_layout): x is the tokens."""
        t, d = self.seq_len, self.d
        return {"layout": "sequence", "row": {"x": [t, d], "y": [t, d]}, "tokens": [t, d],
                "rule": "tokens[t] = x[t]", "target": "y[t] at every token t (the teacher LSA's output)"}

    def teacher_weights(self, dtype=torch.float64) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.teacher_seed)
        w = {name: torch.randn(self.d, self.d, generator=g, dtype=torch.float64) * self.w_std for name in ("w_v", "w_k", "w_q")}
        return {k: v.to(dtype) for k, v in w.items()}

    def teacher_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """y_t = Σ_{t' ≤ t} (W_V x_t')(W_K x_t')ᵀ (W_Q x_t) for x (B, T, d), in x's dtype."""
        w = _weights_on(self, x.device, x.dtype)
        q, k, v = x @ w["w_q"].T, x @ w["w_k"].T, x @ w["w_v"].T  # (B, T, d)
        s = torch.arange(x.shape[1], device=x.device)
        causal = (s <= s.unsqueeze(1)).to(x.dtype)  # (T, T): [t, t'] = 1 for t' ≤ t
        return ((q @ k.transpose(1, 2)) * causal) @ v  # [t] = Σ_{t'} (k_t'ᵀ q_t) v_t'

    def sample(self, n: int, seed: int | None = None, *, generator: torch.Generator | None = None,
               device=None, dtype: torch.dtype = torch.float32, **_) -> SequenceBatch:
        if (seed is None) == (generator is None):
            raise ValueError("give exactly one of seed= or generator=")
        if generator is None:
            generator = torch.Generator(device=device or "cpu").manual_seed(seed)
        x = torch.randn((n, self.seq_len, self.d), generator=generator, device=generator.device, dtype=dtype) * self.x_std
        with torch.no_grad():  # float64, rounded: the same targets whatever the BLAS (frozen splits hash them)
            y = self.teacher_outputs(x.double()).to(dtype)
        return SequenceBatch(tokens=x, targets=y)

    def batch_from_arrays(self, x: torch.Tensor, y: torch.Tensor) -> SequenceBatch:
        if x.shape[1:] != (self.seq_len, self.d) or y.shape != x.shape:
            raise ValueError(f"expected x and y of shape (N, {self.seq_len}, {self.d}), got {tuple(x.shape)} and {tuple(y.shape)}")
        return SequenceBatch(tokens=x, targets=y)

    @staticmethod
    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((pred - target) ** 2).mean()


@functools.lru_cache(maxsize=32)
def _weights_on(task, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The teacher's weights on `device`, made once: a step replayed as a CUDA graph may not copy them
    from the host while it is being captured (the eager steps before the capture fill this cache)."""
    return {k: v.to(device) for k, v in task.teacher_weights(dtype).items()}
