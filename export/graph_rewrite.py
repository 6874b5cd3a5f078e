"""Rewrites of exported graphs into forms ONNX Runtime's CPU kernels run fast, each computing the same numbers.

ONNX Runtime's elementwise kernels are vectorised along the innermost axis. An operand broadcast along that
axis (last dimension 1 against an output's n > 1) makes them work in spans of one, and its `Softplus` is a
scalar loop. Measured on one thread of the 2-core Xeon, 256 streams of Mamba's (64, 16) state
(benchmarks/release_graphs.py --kernels prints the same table):

    Mul (256, 64, 1) × (256, 1, 16)   345 µs    MatMul of the same operands      77 µs
    Mul (256, 64, 1) × (64, 16)       307 µs    Mul of same-shaped operands      76 µs
    Softplus (256, 64)                242 µs    Exp, Add, Log                    47 µs

- `outer products`: Mul(a (…, m, 1), b (…, 1, n)) is MatMul(a, b) where m·n ≥ MATMUL_OUTER_MIN: a sum over one
  product, the same number.
- `inner broadcasts`: a fixed-size operand (a parameter) broadcast along an axis after its first real one, as
  (4, 1, 6) against (batch, 4, 6, 6), is first expanded to its trailing shape (4, 6, 6): the kernel then
  broadcasts it along leading axes only (207 → 29 µs at batch 512).
- `innermost broadcasts`: another operand of Add/Sub/Mul/Div with last dimension 1 against an output's n > 1
  is first widened by MatMul(operand, ones (1, n)) (x · 1, exact), so the kernel sees full spans.
- `softplus`: log(1 + eˣ) as max(x, 0) + log1p(e^−|x|) (no overflow, no branch), with log1p(u) as
  log(w) + (u − (w − 1)) / w for w = 1 + u rounded: the second term restores what the rounding of 1 + u lost,
  which a bare log(1 + u) drops (all of a u below float32's ε).

Every exported graph passes through `rewrite` before the export holds it to the float64 model
(onnx_export.check_graph): a rewrite that changed a number would be refused there.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

ELEMENTWISE = ("Add", "Sub", "Mul", "Div")
# An outer product of m × n this large runs faster as a MatMul; smaller ones (retention's 6 × 6 per head) are
# batched GEMMs of a few elements each, slower than the broadcasting Mul (294 against 251 µs at 2,048 × 6 × 6).
MATMUL_OUTER_MIN = 64


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    """Every float32 value's static shape where inference knows it: ints, or names for symbolic axes (the
    rewrites widen with float32 ones, so integer shape arithmetic is left alone)."""
    g = shape_inference.infer_shapes(model).graph
    shapes = {v.name: [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in v.type.tensor_type.shape.dim]
              for v in list(g.value_info) + list(g.input) + list(g.output)
              if v.type.tensor_type.HasField("shape") and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    shapes |= {i.name: list(i.dims) for i in g.initializer if i.data_type == onnx.TensorProto.FLOAT}
    return shapes


def _last(shape) -> int | None:
    return shape[-1] if shape and isinstance(shape[-1], int) else None


class _Names:
    def __init__(self, graph: onnx.GraphProto):
        self.used = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}

    def __call__(self, base: str) -> str:
        i = 0
        while f"{base}.{i}" in self.used:
            i += 1
        self.used.add(name := f"{base}.{i}")
        return name


def _inner_broadcast(shape: list, out: list) -> list | None:
    """For an operand of fixed `shape` (no symbolic axis) that broadcasts against `out` along an axis after its
    first real one (e.g. (4, 1, 6) against (batch, 4, 6, 6)): the trailing shape to expand it to, (4, 6, 6), so
    that it broadcasts along leading axes only. None where it already does, or where that shape is not fixed."""
    if any(not isinstance(d, int) for d in shape) or len(shape) > len(out):
        return None
    aligned = [1] * (len(out) - len(shape)) + list(shape)
    first = next((j for j, d in enumerate(aligned) if d != 1), None)
    if first is None or not any(aligned[j] == 1 and out[j] != 1 for j in range(first + 1, len(out))):
        return None
    trailing = out[first:]
    return trailing if all(isinstance(d, int) for d in trailing) else None


def _broadcasts_inside(shape: list, out: list) -> bool:
    """Does an operand of `shape` broadcast against `out` along an axis after its first real (≠ 1) one?"""
    aligned = [1] * (len(out) - len(shape)) + list(shape)
    first = next((j for j, d in enumerate(aligned) if d != 1), len(out))
    return any(aligned[j] == 1 and out[j] != 1 for j in range(first + 1, len(out)))


def _broadcast_nodes(node, shapes, names, initializers) -> list | None:
    """The replacement of one elementwise node broadcast along its innermost axis, or None to keep it."""
    if node.op_type not in ELEMENTWISE or len(node.input) != 2:
        return None
    a, b = node.input
    sa, sb, so = shapes.get(a), shapes.get(b), shapes.get(node.output[0])
    n = _last(so)
    if not sa or not sb or n is None or n == 1 or "?" in (*sa, *sb):
        return None
    outer = node.op_type == "Mul" and len(sa) >= 2 and len(sb) >= 2 and isinstance(sa[-2], int) and isinstance(sb[-2], int)
    if outer and sa[-1] == 1 and sb[-2] == 1 and sa[-2] * n >= MATMUL_OUTER_MIN:
        return [helper.make_node("MatMul", [a, b], list(node.output), name=names(f"{node.name}.outer"))]
    if outer and sb[-1] == 1 and sa[-2] == 1 and sb[-2] * n >= MATMUL_OUTER_MIN:
        return [helper.make_node("MatMul", [b, a], list(node.output), name=names(f"{node.name}.outer"))]
    widened, replacement = list(node.input), []
    for i, (name, shape) in enumerate(((a, sa), (b, sb))):
        inner = _inner_broadcast(shape, so)
        if inner is not None:  # a fixed-size operand broadcast inside: expanded once to the trailing shape
            target = names(f"{node.name}.shape")
            initializers.append(numpy_helper.from_array(np.array(inner, np.int64), target))
            widened[i] = names(f"{node.name}.wide")
            replacement.append(helper.make_node("Expand", [name, target], [widened[i]], name=names(f"{node.name}.expand")))
        elif _last(shape) == 1 and any(d != 1 for d in shape) and not _broadcasts_inside((sb, sa)[i], so):
            # (not a single number, which the kernel broadcasts fast; not when both broadcast: a small outer product)
            ones = names(f"{node.name}.ones")
            initializers.append(numpy_helper.from_array(np.ones((1, n), np.float32), ones))
            widened[i] = names(f"{node.name}.wide")
            replacement.append(helper.make_node("MatMul", [name, ones], [widened[i]], name=names(f"{node.name}.widen")))
    if not replacement:
        return None
    replacement.append(helper.make_node(node.op_type, widened, list(node.output), name=node.name))
    return replacement


def _softplus_nodes(node, names, initializers) -> list:
    (x,), (y,) = node.input, node.output
    one = names(f"{node.name}.one")
    initializers.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
    v = {k: names(f"{node.name}.{k}") for k in ("abs", "neg", "u", "w", "w1", "lost", "fix", "log", "log1p", "relu")}

    def op(kind, inputs, out):
        return helper.make_node(kind, inputs, [out], name=names(f"{node.name}.{kind.lower()}"))

    return [
        op("Abs", [x], v["abs"]),
        op("Neg", [v["abs"]], v["neg"]),
        op("Exp", [v["neg"]], v["u"]),  # u = e^−|x| in (0, 1]: never overflows
        op("Add", [v["u"], one], v["w"]),  # w = 1 + u, rounded
        op("Sub", [v["w"], one], v["w1"]),  # the u that w holds
        op("Sub", [v["u"], v["w1"]], v["lost"]),  # what the rounding lost
        op("Div", [v["lost"], v["w"]], v["fix"]),
        op("Log", [v["w"]], v["log"]),
        op("Add", [v["log"], v["fix"]], v["log1p"]),  # log1p(u) = log(w) + log(1 + lost/w) ≈ log(w) + lost/w
        op("Relu", [x], v["relu"]),
        op("Add", [v["relu"], v["log1p"]], y),  # softplus(x) = max(x, 0) + log1p(e^−|x|)
    ]


def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the module docstring's rewrites applied to its top-level nodes (a new model; metadata kept)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    shapes = _shapes(model)
    names, extra, nodes = _Names(g), [], []
    for node in g.node:
        if node.op_type == "Softplus" and len(node.input) == 1 and not node.attribute:
            nodes += _softplus_nodes(node, names, extra)
        else:
            nodes += _broadcast_nodes(node, shapes, names, extra) or [node]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(extra)
    onnx.checker.check_model(model)
    return model
