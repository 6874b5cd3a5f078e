"""Model families, one file each. `create_model` turns a validated arch config into a module."""

from __future__ import annotations

from zoo.models.base import NotRecurrentError, ZooModel
from zoo.models.classic_rnn import GRUBlock, LSTMBlock
from zoo.models.fast_weight import FastWeightRNN
from zoo.models.gated_rnn import GatedLinearRNN
from zoo.models.gd_ssm import GDSSM
from zoo.models.griffin import GriffinRecurrentBlock, LocalAttentionBlock
from zoo.models.lru import LRUBlock, S5Block
from zoo.models.lsa import LinearSelfAttention
from zoo.models.mamba import MambaBlock
from zoo.models.stack import SequenceStack
from zoo.models.transformer import SoftmaxTransformer


def create_model(arch, task) -> ZooModel:
    """Build the (untrained) model of `arch` (a registry arch spec) for `task`."""
    if arch.type == "lsa":
        return LinearSelfAttention(
            d=task.token_dim, readout=task.readout, n_layers=arch.n_layers, attention=arch.attention,
            loops=arch.loops, damping=arch.damping, init_std=arch.init_std, residual=arch.residual,
            constant=arch.constant,
        )
    if arch.type == "gated_rnn":
        return GatedLinearRNN(
            d_in=task.token_dim, d_out=task.token_dim, readout=task.readout, hidden=arch.hidden, gates=arch.gates,
            recurrence=arch.recurrence, init_std=arch.init_std, nu_range=arch.lambda_range,
        )
    if arch.type == "gd_ssm":
        # Unset state dimensions follow the task (so a sweep over task.d_x needs no arch override).
        products = getattr(task, "layout", None) == "products"
        value_dim = arch.value_dim or (task.d_x if products else task.d_y)
        key_dim = arch.key_dim or (1 if products else task.d_x)
        return GDSSM(
            d_in=task.token_dim, d_out=task.d_out, readout=task.readout, n_layers=arch.n_layers, window=arch.window,
            value_dim=value_dim, key_dim=key_dim, ridge=arch.ridge, init_std=arch.init_std,
            lambda_range=arch.lambda_range, beta_init=arch.beta_init,
            zero_output=arch.zero_output, embed=arch.embed, mlp=arch.mlp,
        )
    if arch.type == "fast_weight":
        if getattr(task, "layout", None) != "triples":
            raise ValueError("the fast-weight network reads triples [x_t, y_t, x_{t+1}]: it needs a task with layout 'triples'")
        return FastWeightRNN(
            d_x=task.d_x, d_y=task.d_y, d_out=task.d_out, readout=task.readout, key_dim=arch.key_dim,
            value_dim=arch.value_dim, update=arch.update, position_scale=arch.position_scale, init_std=arch.init_std,
        )
    if arch.type == "softmax_transformer":
        return SoftmaxTransformer(
            d_in=task.token_dim, d_out=task.d_out, readout=task.readout, width=arch.width, n_layers=arch.n_layers,
            heads=arch.heads, mlp=arch.mlp, causal=arch.causal, max_len=arch.max_len,
        )
    if arch.type in STACK_BLOCKS:
        blocks = [STACK_BLOCKS[arch.type](arch, i) for i in range(arch.n_layers)]
        return SequenceStack(task.token_dim, task.d_out, task.readout, blocks, arch.width,
                             residual=arch.type not in ("lstm", "gru", "bilstm"))
    raise ValueError(f"unknown architecture type {arch.type!r}")


STACK_BLOCKS = {  # arch type → block of layer i
    "lru": lambda a, i: LRUBlock(a.width, a.hidden or a.width, a.variant, *a.r_range),
    "s5": lambda a, i: S5Block(a.width, a.hidden or a.width),
    "lstm": lambda a, i: LSTMBlock(a.width),
    "gru": lambda a, i: GRUBlock(a.width),
    "bilstm": lambda a, i: LSTMBlock(a.width, bidirectional=True),
    "mamba": lambda a, i: MambaBlock(a.width, a.state_size, a.expand),
    "griffin": lambda a, i: LocalAttentionBlock(a.width, a.window) if i % 2 else GriffinRecurrentBlock(a.width, a.expand),
}


__all__ = ["GDSSM", "FastWeightRNN", "GatedLinearRNN", "LinearSelfAttention", "NotRecurrentError", "SequenceStack", "SoftmaxTransformer", "ZooModel", "create_model"]
