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
type to block, and the rules of its constructions (LSTM and LRU layers standing for an LSA layer or a
gated RNN, Zucchet et al. Tables 3–4), whose math is in stack_constructions.py.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from zoo.science.models.base import ConstructionRule, Family, NotRecurrentError, RecurrentBlock, ZooModel
from zoo.science.models.classic_rnn import GRUBlock, LSTMBlock
from zoo.science.models.gated_rnn import GatedLinearRNN, RNNFromLSAKnobs, compact_problem, rnn_from_lsa, rnn_size
from zoo.science.models.griffin import GriffinRecurrentBlock, LocalAttentionBlock
from zoo.science.models.lru import LRUBlock, S5Block
from zoo.science.models.lsa import ImplementedLSA, implemented_lsa, lsa_problem, lsa_width
from zoo.science.models.mamba import MambaBlock
from zoo.science.models.stack_constructions import (
    LRU_LAYERS,
    lru_from_gated_rnn,
    lru_in_skip_from_lsa,
    lru_in_skip_lsa_size,
    lru_size,
    lstm2_width,
    lstm_from_gated_rnn,
    lstm_from_lsa,
    lstm_width,
)
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


# ---------------------------------------------------------------------------- constructions (math: stack_constructions.py)
class LinearisedLSAKnobs(ImplementedLSA):
    """An LSA layer's stand-in with linearised gates (`lstm_from_lsa`, `lru_in_skip_from_lsa`)."""

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


class LinearisedRNNKnobs(RNNFromLSAKnobs):
    """A gated RNN's stand-in with linearised gates (`lstm_from_gated_rnn`, `lru_from_gated_rnn`)."""

    scale: float = Field(0.01, gt=0)  # linearisation scale ε of every paired gate (error O(ε²) until rounding)


def _implemented_gated_rnn(model: SequenceStack, task, source, validation_batch=None) -> tuple[GatedLinearRNN, dict]:
    """The LSA (θ_GD or the teacher) → the gated RNN that implements it exactly (float64), and what to record."""
    weights, info = implemented_lsa(task, source, validation_batch)
    rnn = GatedLinearRNN(model.d_in, model.d_out, model.readout, **rnn_size(lsa_width(task), source.compact)).double()
    rnn_from_lsa(rnn, *(w.double() for w in weights), compact=source.compact)
    return rnn, {**info, "compact": source.compact, "scale": source.scale}


def _lstm2_width_for(task, source) -> int:
    return lstm2_width(**rnn_size(lsa_width(task), source.compact))


def _lstm_from_gated_rnn_problem(arch: RecurrentStackArch, task, source) -> str | None:
    problem = lsa_problem(task, source) or compact_problem(source)
    if problem:
        return problem
    width = _lstm2_width_for(task, source)
    if arch.type != "lstm" or arch.n_layers != 2 or arch.width != width or arch.residual:
        return f"'lstm_from_gated_rnn' needs two 'lstm' layers of width 2·max(n, m) = {width} without residual"
    return None


def _apply_lstm_from_gated_rnn(model: SequenceStack, task, source, validation_batch=None) -> dict:
    """The LSA (θ_GD or the teacher) → the gated RNN that implements it exactly (float64) → two LSTM layers."""
    rnn, info = _implemented_gated_rnn(model, task, source, validation_batch)
    lstm_from_gated_rnn(model, rnn, scale=source.scale)
    return info


def _lru_from_gated_rnn_problem(arch: RecurrentStackArch, task, source) -> str | None:
    problem = lsa_problem(task, source) or compact_problem(source)
    if problem:
        return problem
    d = lsa_width(task)
    size = lru_size(**rnn_size(d, source.compact), d=d, variant=arch.variant)
    layers = LRU_LAYERS[arch.variant]
    if arch.n_layers != layers or arch.width != size["width"] or arch.hidden != size["hidden"] or arch.residual is not False:
        return (f"'lru_from_gated_rnn' with variant {arch.variant!r} needs {layers} 'lru' layer(s) of width {size['width']}, "
                f"hidden {size['hidden']} and residual = false")
    return None


def _apply_lru_from_gated_rnn(model: SequenceStack, task, source, validation_batch=None) -> dict:
    """The LSA (θ_GD or the teacher) → the gated RNN that implements it exactly (float64) → LRU layers."""
    rnn, info = _implemented_gated_rnn(model, task, source, validation_batch)
    lru_from_gated_rnn(model, rnn, scale=source.scale)
    return info


def _lru_in_skip_from_lsa_problem(arch: RecurrentStackArch, task, source) -> str | None:
    problem = lsa_problem(task, source)
    if problem:
        return problem
    size = lru_in_skip_lsa_size(lsa_width(task))
    if (arch.variant != "in_skip" or arch.n_layers != 1 or arch.width != size["width"] or arch.hidden != size["hidden"]
            or arch.residual is not False):
        return (f"'lru_in_skip_from_lsa' needs one 'lru' layer of variant 'in_skip', width {size['width']}, "
                f"hidden {size['hidden']} and residual = false")
    return None


def _apply_lru_in_skip_from_lsa(model: SequenceStack, task, source, validation_batch=None) -> dict:
    weights, info = implemented_lsa(task, source, validation_batch)
    lru_in_skip_from_lsa(model, *weights, scale=source.scale)
    return {**info, "scale": source.scale}


STACK_CONSTRUCTIONS = {
    "lstm_from_lsa": ConstructionRule(_lstm_from_lsa_problem, _apply_lstm_from_lsa, "an LSTM layer ≈ an LSA layer, exact as ε → 0",
                                      arch_types=("lstm",), knobs=LinearisedLSAKnobs, exact=False),
    "lstm_from_gated_rnn": ConstructionRule(_lstm_from_gated_rnn_problem, _apply_lstm_from_gated_rnn,
                                            "two LSTM layers ≈ the gated RNN that implements an LSA layer, exact as ε → 0",
                                            arch_types=("lstm",), knobs=LinearisedRNNKnobs, exact=False),
    "lru_from_gated_rnn": ConstructionRule(_lru_from_gated_rnn_problem, _apply_lru_from_gated_rnn,
                                           "LRU layers (In+Out ×1, Out ×2, In+Skip ×2) ≈ the gated RNN that implements an LSA "
                                           "layer, exact as ε → 0", arch_types=("lru",), knobs=LinearisedRNNKnobs, exact=False),
    "lru_in_skip_from_lsa": ConstructionRule(_lru_in_skip_from_lsa_problem, _apply_lru_in_skip_from_lsa,
                                             "one LRU In+Skip layer ≈ an LSA layer, exact as ε → 0", arch_types=("lru",),
                                             knobs=LinearisedLSAKnobs, exact=False),
}


FAMILY = Family(
    name="stack",
    arch=RecurrentStackArch,
    build=build,
    constructions=STACK_CONSTRUCTIONS,
    card="""
A deep recurrent stack (linear embedding → blocks → linear read-out, no normalisation layers, as
Zucchet et al. A.1 compare them): LRU (with its gating variants), S5, LSTM, GRU, bi-LSTM, Mamba or
Griffin blocks, trained on the same frozen tasks as the models that implement gradient descent and
scored with the same metrics; or LSTM and LRU layers constructed to stand for a linear self-attention layer
or a gated RNN (Zucchet et al., Tables 3–4), approximately: their gates are linearised at a scale ε.
""",
)
