"""Whole-sequence graphs with bounded intermediates, built from other graphs with onnx and no torch.

    from_zero_state(chunk)      (tokens (B, T, d_in)) -> (out (B, T, d_out)): a chunk graph run from the zero state,
                                its state made inside the graph (ConstantOfShape from the batch size)
    batch_blocked(sequence)     the same interface, the batch cut into blocks of at most BATCH_BLOCK sequences
                                that an ONNX `Scan` runs one after another
    recurrent_sequence_graph(step) = batch_blocked(from_zero_state(scan_step_graph(step)))

Why. A model's `forward` exported as it is (the parallel form: ⌈log₂ T⌉ doublings of (B, T, state)
tensors) keeps intermediates of the whole batch and the whole sequence alive at once: Mamba's exported
forward took 17 MB per 10-token task, so 17 GB for 1,000 tasks. A recurrent model's step graph scanned
over time holds one step's (B, state) at a time, and cutting the batch into blocks bounds even that by
the block: the graph's memory does not grow with the batch a caller feeds it nor with T (only its input
and output do). Small blocks also keep each step's working set in cache: the block size is measured
(benchmarks/release_graphs.py --block; reports/engineering/release-graphs.md).

Exact by construction: the same step operators in the same order as model_step.onnx (which the export
holds to torch), on rows that never mix (padding rows are zeros, computed and dropped).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.scan_graph import renamed_copy, scan_step_graph

BATCH_BLOCK = 256  # sequences per block where no state size says better (a softmax transformer's forward)
# A scanned step's working set is a few (block, state) tensors: sized to ~256 KiB of state per block they stay in a
# core's L2 cache. Measured on one thread of the 2-core Xeon, full test splits, tokens/s by block (rewritten graphs):
#   Mamba (1,216 floats)   16: 0.23M  32: 0.30M  64: 0.33M  128: 0.32M  256: 0.27M  512: 0.25M
#   LRU (128 floats)       32: 0.70M  64: 0.81M  128: 0.90M  256: 0.93M  512: 0.99M
#   gated RNN (80 floats)  64: 1.55M  128: 1.58M  256: 1.74M  512: 1.83M  1024: 1.77M
STATE_FLOATS_PER_BLOCK = 2**16
BLOCK_RANGE = (32, 512)


def block_for(state_floats: int) -> int:
    """Sequences per block for a state of `state_floats` floats a sequence: the power of two nearest
    STATE_FLOATS_PER_BLOCK / state_floats, within BLOCK_RANGE (the table above)."""
    ideal = STATE_FLOATS_PER_BLOCK / max(1, state_floats)
    power = 2 ** round(np.log2(ideal))
    return int(min(max(power, BLOCK_RANGE[0]), BLOCK_RANGE[1]))


def _const(name: str, values, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, dtype), name))


def _retyped(value: onnx.ValueInfoProto, name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, value.type.tensor_type.elem_type, dims)


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def from_zero_state(chunk: onnx.ModelProto) -> onnx.ModelProto:
    """`chunk` (tokens, state_in.* -> out, state_out.*) as a sequence graph (tokens -> out) that starts
    every sequence from the zero state, as `forward` does: each state_in.<name> is a ConstantOfShape of
    (batch, *its shape) made from the tokens' batch size. The final states are left unread."""
    g = chunk.graph
    layout = json.loads({p.key: p.value for p in chunk.metadata_props}["icl_zoo.state_layout"])
    inputs, outputs = {i.name: i for i in g.input}, {o.name: o for o in g.output}
    nodes = [helper.make_node("Shape", ["tokens"], ["zero.batch"], start=0, end=1)]  # (1,) int64: B
    for i, s in enumerate(layout):
        dims = _dims(inputs[s["input"]])[1:]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise ValueError(f"state {s['input']} has a symbolic or empty dimension {dims}: no zero state to make")
        nodes += [_const(f"zero.dims.{i}", dims),
                  helper.make_node("Concat", ["zero.batch", f"zero.dims.{i}"], [f"zero.shape.{i}"], axis=0),
                  helper.make_node("ConstantOfShape", [f"zero.shape.{i}"], [s["input"]],
                                   value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))]
    graph = helper.make_graph(nodes + list(g.node), "sequence", inputs=[inputs["tokens"]], outputs=[outputs["out"]],
                              initializer=list(g.initializer), value_info=list(g.value_info))
    model = helper.make_model(graph, opset_imports=list(chunk.opset_import), functions=list(chunk.functions),
                              ir_version=chunk.ir_version)
    onnx.checker.check_model(model)
    return model


def batch_blocked(sequence: onnx.ModelProto, block: int = BATCH_BLOCK) -> onnx.ModelProto:
    """`sequence` (tokens (B, T, d_in) -> out (B, T, d_out)) run on blocks of min(B, `block`) sequences:
    the batch zero-padded to a whole number of blocks, reshaped (blocks, block, T, d_in), scanned over its
    first axis (each block one run of `sequence`'s nodes), and the padding rows dropped from the output."""
    if block < 1:
        raise ValueError(f"block must be ≥ 1, got {block}")
    g = sequence.graph
    (tokens,), (out,) = g.input, g.output
    rename = {tokens.name: "block.tokens", out.name: "block.out"}
    body_nodes = [renamed_copy(node, rename) for node in g.node]
    d_in, d_out = _dims(tokens)[2], _dims(out)[2]
    body = helper.make_graph(body_nodes, "block", inputs=[_retyped(tokens, "block.tokens", ["block", "time", d_in])],
                             outputs=[_retyped(out, "block.out", ["block", "time", d_out])],
                             initializer=list(g.initializer), value_info=list(g.value_info))

    def node(op, inputs, output, **attrs):
        return helper.make_node(op, inputs, [output], **attrs)

    nodes = [
        node("Shape", ["tokens"], "blocked.shape"),  # (B, T, d_in)
        _const("blocked.zero", [0]), _const("blocked.one", [1]), _const("blocked.three", [3]),
        _const("blocked.most", [block]), _const("blocked.axis0", [0]),
        node("Slice", ["blocked.shape", "blocked.zero", "blocked.one"], "blocked.batch"),  # (1,): B
        node("Slice", ["blocked.shape", "blocked.one", "blocked.three"], "blocked.rest"),  # (2,): T, d_in
        node("Min", ["blocked.batch", "blocked.most"], "blocked.size"),  # sequences per block: min(B, block)
        node("Add", ["blocked.batch", "blocked.size"], "blocked.b_plus"),
        node("Sub", ["blocked.b_plus", "blocked.one"], "blocked.b_round"),
        node("Div", ["blocked.b_round", "blocked.size"], "blocked.count"),  # ⌈B / size⌉ blocks
        node("Mul", ["blocked.count", "blocked.size"], "blocked.padded_batch"),
        node("Sub", ["blocked.padded_batch", "blocked.batch"], "blocked.padding"),
        node("Concat", ["blocked.zero", "blocked.zero", "blocked.zero", "blocked.padding", "blocked.zero", "blocked.zero"],
             "blocked.pads", axis=0),
        node("Pad", ["tokens", "blocked.pads"], "blocked.padded"),  # zero rows after the last sequence
        node("Concat", ["blocked.count", "blocked.size", "blocked.rest"], "blocked.shape4", axis=0),
        node("Reshape", ["blocked.padded", "blocked.shape4"], "blocked.tokens"),  # (blocks, size, T, d_in)
        helper.make_node("Scan", ["blocked.tokens"], ["blocked.outs"], num_scan_inputs=1, body=body),
        node("Shape", ["blocked.outs"], "blocked.out_shape"),  # (blocks, size, T, d_out)
        _const("blocked.two", [2]), _const("blocked.four", [4]),
        node("Slice", ["blocked.out_shape", "blocked.two", "blocked.four"], "blocked.out_rest"),
        node("Concat", ["blocked.padded_batch", "blocked.out_rest"], "blocked.flat_shape", axis=0),
        node("Reshape", ["blocked.outs", "blocked.flat_shape"], "blocked.flat"),  # (blocks · size, T, d_out)
        node("Slice", ["blocked.flat", "blocked.zero", "blocked.batch", "blocked.axis0"], "out"),  # the B real rows
    ]
    graph = helper.make_graph(nodes, "sequence", inputs=[_retyped(tokens, "tokens", ["batch", "time", d_in])],
                              outputs=[_retyped(out, "out", ["batch", "time", d_out])])
    model = helper.make_model(graph, opset_imports=list(sequence.opset_import), functions=list(sequence.functions),
                              ir_version=sequence.ir_version)
    onnx.checker.check_model(model)
    return model


def recurrent_sequence_graph(step: onnx.ModelProto, block: int = BATCH_BLOCK) -> onnx.ModelProto:
    """The whole-sequence graph of a recurrent model from its step graph: the step scanned over time from the
    zero state, in batch blocks. Valid for any T ≥ 1 and any batch; memory bounded by the block (module doc)."""
    chunk = scan_step_graph(step)
    chunk.metadata_props.extend(step.metadata_props)  # the state layout, which from_zero_state reads
    return batch_blocked(from_zero_state(chunk), block)
