"""Chunk graphs built from a step graph, with onnx and no torch (the streaming runtime builds them in
memory from the hash-checked model_step.onnx; no file is written):

- scan_step_graph: the step graph wrapped in an ONNX `Scan` over time (also the exported chunk graph
  of models without a parallel form);
- hoisted_step_graph: the step graph's nodes split around the state update, the token projections
  and the read-out run once over all B·T tokens, only the update scanned (in time blocks for a
  diagonal linear update)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def scan_step_graph(step: onnx.ModelProto) -> onnx.ModelProto:
    """The step graph wrapped in an ONNX `Scan` over time: a chunk graph with the chunk graph's
    names, (tokens (B, T, d_in), state_in.* ...) -> (out (B, T, d_out), state_out.* ...), that runs
    the step graph's own nodes T times inside ONNX Runtime (one `run` per chunk instead of one per
    token). Exact for any T by construction: the same operators, in the same order, as the step
    graph. (The exported file's metadata is set by `export_chunk`; a runtime given only a step
    graph builds this in memory.)"""
    g = step.graph
    layout = json.loads({p.key: p.value for p in step.metadata_props}["icl_zoo.state_layout"])
    # The body's interface is renamed (step.*): a subgraph may not reuse the outer graph's names.
    rename = {"token": "step.token", "out": "step.out"}
    rename |= {s[k]: f"step.{s[k]}" for s in layout for k in ("input", "output")}
    body_nodes = [renamed_copy(node, rename) for node in g.node]

    def renamed(value):
        value = onnx.ValueInfoProto.FromString(value.SerializeToString())
        value.name = rename.get(value.name, value.name)
        return value

    inputs, outputs = {i.name: i for i in g.input}, {o.name: o for o in g.output}
    body = helper.make_graph(  # Scan's body: state variables first, then the scanned token
        body_nodes, "step", inputs=[renamed(inputs[s["input"]]) for s in layout] + [renamed(inputs["token"])],
        outputs=[renamed(outputs[s["output"]]) for s in layout] + [renamed(outputs["out"])],
        initializer=list(g.initializer), value_info=[renamed(v) for v in g.value_info])
    scan = helper.make_node(
        "Scan", inputs=[s["input"] for s in layout] + ["tokens"], outputs=[s["output"] for s in layout] + ["out"],
        num_scan_inputs=1, body=body, scan_input_axes=[1], scan_output_axes=[1])

    outer = helper.make_graph(
        [scan], "chunk",
        inputs=[_chunk_value_info("tokens", inputs["token"], True)]
        + [_chunk_value_info(s["input"], inputs[s["input"]]) for s in layout],
        outputs=[_chunk_value_info("out", outputs["out"], True)]
        + [_chunk_value_info(s["output"], outputs[s["output"]]) for s in layout])
    model = helper.make_model(outer, opset_imports=list(step.opset_import), functions=list(step.functions),
                              ir_version=step.ir_version)
    onnx.checker.check_model(model)
    return model


def _chunk_value_info(name: str, like: onnx.ValueInfoProto, timed: bool = False) -> onnx.ValueInfoProto:
    """`like`'s type under `name`; `timed`: with a "time" axis after the batch axis (a chunk's tokens, outputs)."""
    t = like.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in t.shape.dim]
    return helper.make_tensor_value_info(name, t.elem_type, [dims[0], "time", *dims[1:]] if timed else dims)


# ---------------------------------------------------------------- hoisted chunk graph (many streams)
LINEAR_BLOCK = 16  # tokens per block of the blocked linear scan (block gemms, then T/block Scan steps per run)


def _split(step: onnx.ModelProto):
    """The step graph's nodes in three parts: `pre` (no state input upstream: the token's projections),
    `core` (what the new state needs from the old one) and `post` (the read-out of the new state).
    None when the graph does not split that way (a state computed without the old state, an output
    computed inside the core)."""
    g = step.graph
    layout = json.loads({p.key: p.value for p in step.metadata_props}["icl_zoo.state_layout"])
    state_in = {s["input"] for s in layout}
    state_out = [s["output"] for s in layout]
    stateful = set(state_in)
    tokenful = {"token"}
    for node in g.node:  # topological order (ONNX requires it)
        if any(i in stateful for i in node.input):
            stateful.update(node.output)
        if any(i in tokenful for i in node.input):
            tokenful.update(node.output)
    producer = {o: n for n in g.node for o in n.output}
    needed, todo = set(), list(state_out)
    while todo:  # the ancestors of the new state that depend on the old one
        name = todo.pop()
        if name in needed or name not in producer or name not in stateful:
            continue
        needed.add(name)
        todo.extend(producer[name].input)
    if any(o not in needed for o in state_out) or "out" in needed:
        return None
    core = [n for n in g.node if any(o in needed for o in n.output)]
    pre = [n for n in g.node if not any(o in stateful for o in n.output)]
    post = [n for n in g.node if n not in core and n not in pre]
    if len(core) + len(pre) + len(post) != len(g.node) or "out" not in {o for n in post for o in n.output}:
        return None
    if any(i in state_in for n in post for i in n.input):  # a read-out of the old state: not hoisted
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        return None
    return layout, pre, core, post, tokenful


def renamed_copy(node, rename):
    """A copy of `node` with its inputs and outputs renamed by `rename` (names not in it kept)."""
    node = onnx.NodeProto.FromString(node.SerializeToString())
    node.input[:] = [rename.get(n, n) for n in node.input]
    node.output[:] = [rename.get(n, n) for n in node.output]
    return node


def _linear_core(core, layout, initializers):
    """{state input: (decay (n,), u tensor name)} when each state's update is `state_out = a ⊙ state_in
    + u` with `a` a constant vector and `u` computed from the token alone; else None."""
    by_out = {n.output[0]: n for n in core}
    found = {}
    for s in layout:
        if len(s["shape"]) != 2:
            return None
        add = by_out.get(s["output"])
        if add is None or add.op_type != "Add":
            return None
        mul = next((by_out[i] for i in add.input if i in by_out), None)
        if mul is None or mul.op_type != "Mul" or s["input"] not in mul.input:
            return None
        u = [i for i in add.input if i != mul.output[0]]
        a = [i for i in mul.input if i != s["input"]]
        if len(u) != 1 or len(a) != 1 or a[0] not in initializers or u[0] in by_out:
            return None
        decay = numpy_helper.to_array(initializers[a[0]]).astype(np.float64)
        n = s["shape"][1]
        if decay.size not in (1, n) or decay.ndim > 2 or (decay.ndim == 2 and decay.shape[0] != 1):
            return None
        found[s["input"]] = (np.broadcast_to(decay.reshape(-1), (n,)).copy(), u[0])
    if len(core) != 2 * len(layout):
        return None
    return found


MAX_DECAY_GROUPS = 4  # distinct nonzero decays the blocked linear scan does as gemms (more: a Scan within blocks)
MAX_SLICES = 8  # a sparse matmul picks its rows with at most this many Slices, else stays a MatMul


def _sparse_matmuls(nodes, initializers, prefix):
    """(nodes, new initialisers): each MatMul by a constant 2-D matrix with at most one nonzero per
    column becomes a Gather of those rows and a Mul by their values. The same numbers for finite
    inputs: the dense dot product adds only exact zeros to that one product (x·0 = 0); a non-finite
    input would spread NaN through the zeros of the dense product and not through the Gather, which
    is why the runtime sends non-finite tokens to the scanned step graph instead."""
    out, extra = [], []
    for node in nodes:
        w = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if w is not None and len(w.dims) == 2 and w.data_type == onnx.TensorProto.FLOAT:
            a = numpy_helper.to_array(w)
            if a.size and (a != 0).sum(axis=0).max() <= 1:
                rows = np.argmax(a != 0, axis=0).astype(np.int64)
                scale = a[rows, np.arange(a.shape[1])].astype(np.float32)
                name = f"{prefix}.{node.output[0]}"
                runs = [[rows[0], rows[0] + 1]]  # consecutive rows, each run one Slice (ONNX Runtime's Gather
                for r in rows[1:]:  # on the last axis is an element-wise loop, many times slower)
                    if r == runs[-1][1]:
                        runs[-1][1] += 1
                    else:
                        runs.append([r, r + 1])
                if len(runs) > MAX_SLICES:
                    out.append(node)
                    continue
                extra.append(numpy_helper.from_array(scale, f"{name}.scale"))
                pieces = []
                for i, (a0, a1) in enumerate(runs):
                    extra += [numpy_helper.from_array(np.array([a0], np.int64), f"{name}.{i}.start"),
                              numpy_helper.from_array(np.array([a1], np.int64), f"{name}.{i}.stop"),
                              numpy_helper.from_array(np.array([-1], np.int64), f"{name}.{i}.axis")]
                    out.append(helper.make_node("Slice", [node.input[0], f"{name}.{i}.start", f"{name}.{i}.stop", f"{name}.{i}.axis"],
                                                [f"{name}.{i}.piece"]))
                    pieces.append(f"{name}.{i}.piece")
                if len(pieces) > 1:
                    out.append(helper.make_node("Concat", pieces, [f"{name}.picked"], axis=-1))
                else:
                    out.append(helper.make_node("Identity", pieces, [f"{name}.picked"]))
                out.append(helper.make_node("Mul", [f"{name}.picked", f"{name}.scale"], list(node.output)))
                continue
        out.append(node)
    return out, extra


def hoisted_step_graph(step: onnx.ModelProto, *, linear: bool = True, block: int = LINEAR_BLOCK,
                       sparse: bool = True, decay_groups: int | None = None) -> onnx.ModelProto | None:
    """A chunk graph (the chunk graph's names, valid for any T) that runs the step graph's own nodes
    with the work that does not need the carried state taken out of the loop over time: the token's
    projections (`pre`) run once over all B·T tokens, the read-out (`post`) once over all B·T new
    states, and only the state update (`core`) is scanned over time, an ONNX Scan of those few nodes.

    `linear`: where the update is a diagonal linear recurrence with constant decay (`h ← a ⊙ h +
    u(token)`: the gated RNN), time is cut into blocks of `block` tokens laid out time-major, so that
    the Scan runs `block` steps over all B·T/block blocks at once (each from the zero state), then
    one step per block carries the state into the next (h ← a^block ⊙ h + end of block), and each
    token adds a^(t+1) ⊙ (state entering its block): block + T/block scan steps per run instead of T.
    `sparse`: constant matrices with at most one nonzero per column are applied as Gather + Mul
    (_sparse_matmuls). None when the step graph does not split (see _split)."""
    parts = _split(step)
    if parts is None:
        return None
    layout, pre, core, post, tokenful = parts
    g = step.graph
    inits = {i.name: i for i in g.initializer}
    inputs, outputs = {i.name: i for i in g.input}, {o.name: o for o in g.output}
    d_in = inputs["token"].type.tensor_type.shape.dim[1].dim_value
    d_out = outputs["out"].type.tensor_type.shape.dim[1].dim_value
    produced_core = {o for n in core for o in n.output}
    if any(i == "token" for n in core for i in n.input):
        return None
    frontier = sorted({i for n in core for i in n.input if i in tokenful and i not in produced_core})
    carried = sorted({i for n in post for i in n.input if i in produced_core})
    graph = _Hoisted()
    if sparse:
        pre, more = _sparse_matmuls(pre, inits, "pre")
        post, more2 = _sparse_matmuls(post, inits, "post")
        graph.extra += more + more2
    for name, value in (("zero", [0]), ("one", [1]), ("two", [2]), ("minus1", [-1]), ("flat_in", [-1, d_in])):
        graph.const(f"hoist.{name}", value)
    lin = _linear_core(core, layout, inits) if linear else None
    if lin is not None and set(carried) <= {s["output"] for s in layout} and len(layout) == 1:
        _blocked_linear_scan(graph, layout[0], lin, pre, core, post, d_in=d_in, d_out=d_out, block=block,
                             decay_groups=decay_groups)
    else:
        _scanned_core(graph, layout, pre, core, post, frontier, carried)
    return _hoisted_model(step, graph, layout)


class _Hoisted:
    """The hoisted chunk graph being assembled: its nodes, in order, and the initialisers it adds."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.extra: list[onnx.TensorProto] = []

    def const(self, name: str, value, dtype=np.int64) -> str:
        self.extra.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


def _scan_body(layout, seq_inputs, body_core, rename, scanned_outs, tag) -> onnx.GraphProto:
    """The body of a Scan of `seq_inputs` running `body_core` with the states as loop variables;
    scanned_outs: body values also returned at every step (an Identity each)."""
    body = [renamed_copy(n, rename) for n in body_core]
    outs = []
    for c in scanned_outs:
        body.append(helper.make_node("Identity", [rename.get(c, c)], [f"{tag}.{c}.each"]))
        outs.append(helper.make_tensor_value_info(f"{tag}.{c}.each", TensorProto.FLOAT, None))
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
    return helper.make_graph(
        body, tag, inputs=[vi(rename[s["input"]]) for s in layout] + [vi(rename[f]) for f in seq_inputs],
        outputs=[vi(rename[s["output"]]) for s in layout] + outs)


def _scanned_core(graph: _Hoisted, layout, pre, core, post, frontier, carried) -> None:
    """The general hoisting: `pre` over all B·T tokens, one Scan over time of `core` fed the token-only
    values it needs (`frontier`), `post` over all B·T of the values it reads from the core (`carried`)."""
    nodes = graph.nodes
    nodes += [helper.make_node("Reshape", ["tokens", "hoist.flat_in"], ["hoist.token"]),
              helper.make_node("Shape", ["tokens"], ["hoist.bt"], end=2)]
    nodes += [renamed_copy(x, {"token": "hoist.token"}) for x in pre]

    def to_seq(name, seq):  # (B·T, …) -> (B, T, …)
        nodes.extend([helper.make_node("Shape", [name], [f"{seq}.rest"], start=1),
                      helper.make_node("Concat", ["hoist.bt", f"{seq}.rest"], [f"{seq}.shape"], axis=0),
                      helper.make_node("Reshape", [name, f"{seq}.shape"], [seq])])

    for f in frontier:
        to_seq(f, f"{f}.seq")
    rename = {s["input"]: f"step.{s['input']}" for s in layout} | {s["output"]: f"step.{s['output']}" for s in layout}
    rename |= {f: f"step.{f}" for f in frontier}
    body = _scan_body(layout, frontier, core, rename, carried, "step")
    nodes.append(helper.make_node(
        "Scan", [s["input"] for s in layout] + [f"{f}.seq" for f in frontier],
        [s["output"] for s in layout] + [f"{c}.seq" for c in carried], num_scan_inputs=len(frontier), body=body,
        scan_input_axes=[1] * len(frontier), **({"scan_output_axes": [1] * len(carried)} if carried else {})))
    rename_post = {"out": "hoist.out"}
    for c in carried:  # (B, T, …) -> (B·T, …)
        nodes.extend([helper.make_node("Shape", [f"{c}.seq"], [f"{c}.seq.rest"], start=2),
                      helper.make_node("Concat", ["hoist.minus1", f"{c}.seq.rest"], [f"{c}.seq.flat"], axis=0),
                      helper.make_node("Reshape", [f"{c}.seq", f"{c}.seq.flat"], [f"{c}.flatpost"])])
        rename_post[c] = f"{c}.flatpost"
    nodes += [renamed_copy(x, rename_post) for x in post]
    to_seq("hoist.out", "out")


# The blocked linear scan (`h ← a ⊙ h + u(token)`, one state): its tensors are named lin.*; T is padded to
# whole blocks of C tokens laid out time-major, (C, B, nb, …), and R = B·nb blocks are scanned at once.
def _blocked_linear_scan(graph: _Hoisted, s, lin, pre, core, post, *, d_in, d_out, block, decay_groups) -> None:
    """The linear update in time blocks (hoisted_step_graph's `linear`): the token projections over the
    blocked tokens, (1) each block's end from the zero state, (2) the state carried across blocks, one
    step per block, (3) each token's state, then the read-out and the last state."""
    decay, u = lin[s["input"]]
    n, C = decay.size, block
    p = "lin"
    graph.const(f"{p}.C", [C])
    graph.const(f"{p}.shape_blocks", [0, -1, C, d_in])
    graph.const(f"{p}.shape_u", [C, -1, n])
    graph.const(f"{p}.d_out", [d_out])
    graph.const(f"{p}.shape_final", [0, -1, d_out])
    graph.const(f"{p}.aC", (decay ** C).astype(np.float32), np.float32)
    graph.const(f"{p}.D", (decay[None, :] ** (np.arange(C)[:, None] + 1)).reshape(C, 1, 1, n), np.float32)
    _time_major_tokens(graph, pre)
    graph.const(f"{p}.zshape_tail", [n])
    graph.nodes.append(helper.make_node("Reshape", [u, f"{p}.shape_u"], [f"{p}.u"]))  # (C, B·nb, n)
    values = [v for v in np.unique(decay) if v != 0]
    gemm = len(values) <= (MAX_DECAY_GROUPS if decay_groups is None else decay_groups)
    if gemm:
        _block_ends_by_gemm(graph, decay, values, C, n)
    else:
        _block_ends_by_scan(graph, s, u, core)
    _across_blocks(graph, s)
    # step 3, each token: its in-block value + a^(t+1) ⊙ the state entering its block, as (C, B, nb, n)
    graph.nodes.append(helper.make_node("Concat", [f"{p}.C", f"{p}.B", "hoist.minus1", f"{p}.zshape_tail"],
                                        [f"{p}.shape_hl2"], axis=0))
    if gemm:
        _token_states_by_gemm(graph, values)
    else:
        _token_states_by_carry(graph)
    _last_state_and_read_out(graph, s, post)


def _time_major_tokens(graph: _Hoisted, pre) -> None:
    """The tokens padded to whole blocks, time-major, flattened to (C·B·nb, d_in); `pre` run on them."""
    p = "lin"
    graph.nodes += [
        # pad T to whole blocks with zero tokens at the end (later tokens never reach earlier ones)
        helper.make_node("Shape", ["tokens"], [f"{p}.T"], start=1, end=2),
        helper.make_node("Shape", ["tokens"], [f"{p}.B"], start=0, end=1),
        helper.make_node("Neg", [f"{p}.T"], [f"{p}.negT"]),
        helper.make_node("Mod", [f"{p}.negT", f"{p}.C"], [f"{p}.pad"]),  # (−T) mod C
        helper.make_node("Concat", ["hoist.zero", "hoist.zero", "hoist.zero", "hoist.zero", f"{p}.pad", "hoist.zero"],
                         [f"{p}.pads"], axis=0),
        helper.make_node("Pad", ["tokens", f"{p}.pads"], [f"{p}.tp"]),  # (B, T', d_in)
        helper.make_node("Reshape", [f"{p}.tp", f"{p}.shape_blocks"], [f"{p}.tb"]),  # (B, nb, C, d_in)
        helper.make_node("Transpose", [f"{p}.tb"], [f"{p}.tt"], perm=[2, 0, 1, 3]),  # (C, B, nb, d_in): time-major
        helper.make_node("Reshape", [f"{p}.tt", "hoist.flat_in"], ["hoist.token"]),  # (C·B·nb, d_in)
    ]
    graph.nodes += [renamed_copy(x, {"token": "hoist.token"}) for x in pre]


def _block_ends_by_gemm(graph: _Hoisted, decay, values, C: int, n: int) -> None:
    """Step 1, within blocks, one gemm per distinct decay a over all channels: the end of each block from
    the zero state is Σ_s a^(C−1−s) u_s ((1 × C) @ (C × R·n)); channels take their own decay's result
    (Where); a decay of 0 leaves u itself. Also the per-decay constants step 3 uses (Lp, mf, nf)."""
    p = "lin"
    graph.const(f"{p}.Cm1s", C - 1)
    graph.const(f"{p}.flat2", [C, -1])
    graph.const(f"{p}.row", [1, -1])
    graph.const(f"{p}.Rn", [-1, n])
    nodes = graph.nodes
    nodes += [helper.make_node("Reshape", [f"{p}.u", f"{p}.flat2"], [f"{p}.Uf"]),  # (C, R·n)
              helper.make_node("Gather", [f"{p}.u", f"{p}.Cm1s"], [f"{p}.e0"], axis=0)]  # (R, n): decay 0
    k = np.arange(C)
    ends = f"{p}.e0"
    for i, v in enumerate(values):
        graph.const(f"{p}.v{i}", (v ** (C - 1 - k))[None, :], np.float32)
        Lp = np.zeros((C, C + 1))
        Lp[:, 0] = v ** (k + 1)  # the state entering the block, carried to token t
        Lp[:, 1:] = np.where(k[:, None] >= k[None, :], v ** np.maximum(k[:, None] - k[None, :], 0), 0.0)
        graph.const(f"{p}.Lp{i}", Lp, np.float32)
        graph.const(f"{p}.m{i}", decay == v, np.bool_)
        graph.const(f"{p}.mf{i}", decay == v, np.float32)
        graph.const(f"{p}.nf{i}", decay != v, np.float32)
        nodes += [helper.make_node("MatMul", [f"{p}.v{i}", f"{p}.Uf"], [f"{p}.e{i}f"]),
                  helper.make_node("Reshape", [f"{p}.e{i}f", f"{p}.Rn"], [f"{p}.e{i}r"]),
                  helper.make_node("Where", [f"{p}.m{i}", f"{p}.e{i}r", ends], [f"{p}.ends{i}"])]
        ends = f"{p}.ends{i}"
    nodes.append(helper.make_node("Identity", [ends], [f"{p}.ends"]))


def _block_ends_by_scan(graph: _Hoisted, s, u: str, core) -> None:
    """Step 1, within blocks, every block from the zero state at once: the step's own update, C steps
    (lin.ends, and every step's state lin.Hl)."""
    p = "lin"
    graph.nodes += [
        helper.make_node("Shape", [f"{p}.u"], [f"{p}.rows"], start=1, end=2),
        helper.make_node("Concat", [f"{p}.rows", f"{p}.zshape_tail"], [f"{p}.zshape"], axis=0),
        helper.make_node("ConstantOfShape", [f"{p}.zshape"], [f"{p}.zero_state"],
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
    ]
    rename = {s["input"]: "in.h", s["output"]: "in.h_out", u: "in.u"}
    body = _scan_body([s], [u], core, rename, [s["output"]], "in")
    graph.nodes.append(helper.make_node("Scan", [f"{p}.zero_state", f"{p}.u"], [f"{p}.ends", f"{p}.Hl"],
                                        num_scan_inputs=1, body=body, scan_input_axes=[0], scan_output_axes=[0]))


def _across_blocks(graph: _Hoisted, s) -> None:
    """Step 2, across blocks: h ← a^C ⊙ h + end of block, one step per block from the carried state; lin.P
    (B, nb, n) is the state entering each block."""
    p = "lin"
    graph.nodes += [
        helper.make_node("Concat", [f"{p}.B", "hoist.minus1", f"{p}.zshape_tail"], [f"{p}.shape_ends2"], axis=0),
        helper.make_node("Reshape", [f"{p}.ends", f"{p}.shape_ends2"], [f"{p}.E"])]  # (B, nb, n)
    vi = lambda nm: helper.make_tensor_value_info(nm, TensorProto.FLOAT, None)
    across = helper.make_graph(
        [helper.make_node("Mul", [f"{p}.aC", "x.h"], ["x.ah"]),
         helper.make_node("Add", ["x.ah", "x.end"], ["x.h_out"]),
         helper.make_node("Identity", ["x.h"], ["x.entering"])],
        "across", inputs=[vi("x.h"), vi("x.end")], outputs=[vi("x.h_out"), vi("x.entering")])
    graph.nodes.append(helper.make_node("Scan", [s["input"], f"{p}.E"], [f"{p}.after", f"{p}.P"], num_scan_inputs=1,
                                        body=across, scan_input_axes=[1], scan_output_axes=[1]))  # P (B, nb, n)


def _token_states_by_gemm(graph: _Hoisted, values) -> None:
    """Step 3 after gemm block ends: [state entering the block; u] @ (C × (C+1)) per decay, the carry and
    the block in one gemm; lin.H (C, B, nb, n) is every token's new state."""
    p = "lin"
    nodes = graph.nodes
    nodes += [helper.make_node("Reshape", [f"{p}.P", f"{p}.row"], [f"{p}.Pf"]),  # (1, R·n)
              helper.make_node("Concat", [f"{p}.Pf", f"{p}.Uf"], [f"{p}.X"], axis=0)]  # (C+1, R·n)
    Hs = f"{p}.u"
    for i, _ in enumerate(values):
        nodes += [helper.make_node("MatMul", [f"{p}.Lp{i}", f"{p}.X"], [f"{p}.H{i}f"]),
                  helper.make_node("Reshape", [f"{p}.H{i}f", f"{p}.shape_u"], [f"{p}.H{i}"]),  # (C, R, n)
                  # H·m + Hs·(1 − m), m ∈ {0, 1} per channel: exact for finite values, and
                  # several times faster than a broadcast Where in ONNX Runtime
                  helper.make_node("Mul", [f"{p}.H{i}", f"{p}.mf{i}"], [f"{p}.Hm{i}"]),
                  helper.make_node("Mul", [Hs, f"{p}.nf{i}"], [f"{p}.Hn{i}"]),
                  helper.make_node("Add", [f"{p}.Hm{i}", f"{p}.Hn{i}"], [f"{p}.Hs{i}"])]
        Hs = f"{p}.Hs{i}"
    nodes.append(helper.make_node("Reshape", [Hs, f"{p}.shape_hl2"], [f"{p}.H"]))  # (C, B, nb, n)


def _token_states_by_carry(graph: _Hoisted) -> None:
    """Step 3 after scanned block ends: each token's in-block state (lin.Hl) + a^(t+1) ⊙ the state entering
    its block; lin.H (C, B, nb, n)."""
    p = "lin"
    graph.nodes += [
        helper.make_node("Reshape", [f"{p}.Hl", f"{p}.shape_hl2"], [f"{p}.Hl4"]),  # (C, B, nb, n)
        helper.make_node("Mul", [f"{p}.D", f"{p}.P"], [f"{p}.carry"]),  # (C,1,1,n)·(B,nb,n) → (C, B, nb, n)
        helper.make_node("Add", [f"{p}.Hl4", f"{p}.carry"], [f"{p}.H"]),
    ]


def _last_state_and_read_out(graph: _Hoisted, s, post) -> None:
    """The state after token T − 1 (state_out), and `post` over every token's state, back to (B, T, d_out)."""
    p = "lin"
    graph.nodes += [
        # the state after token T − 1 (block (T−1) div C, position (T−1) mod C)
        helper.make_node("Sub", [f"{p}.T", "hoist.one"], [f"{p}.last"]),
        helper.make_node("Mod", [f"{p}.last", f"{p}.C"], [f"{p}.last_t"]),
        helper.make_node("Div", [f"{p}.last", f"{p}.C"], [f"{p}.last_b"]),
        helper.make_node("Squeeze", [f"{p}.last_t"], [f"{p}.last_t0"]),
        helper.make_node("Squeeze", [f"{p}.last_b"], [f"{p}.last_b0"]),
        helper.make_node("Gather", [f"{p}.H", f"{p}.last_t0"], [f"{p}.Hlast"], axis=0),  # (B, nb, n)
        helper.make_node("Gather", [f"{p}.Hlast", f"{p}.last_b0"], [s["output"]], axis=1),  # (B, n)
        helper.make_node("Concat", ["hoist.minus1", f"{p}.zshape_tail"], [f"{p}.shape_flat"], axis=0),
        helper.make_node("Reshape", [f"{p}.H", f"{p}.shape_flat"], [f"{s['output']}.flatpost"]),  # (C·B·nb, n)
    ]
    graph.nodes += [renamed_copy(x, {"out": "hoist.out", s["output"]: f"{s['output']}.flatpost"}) for x in post]
    graph.nodes += [
        helper.make_node("Concat", [f"{p}.C", f"{p}.B", "hoist.minus1", f"{p}.d_out"], [f"{p}.so"], axis=0),
        helper.make_node("Reshape", ["hoist.out", f"{p}.so"], [f"{p}.o4"]),  # (C, B, nb, d_out)
        helper.make_node("Transpose", [f"{p}.o4"], [f"{p}.ob"], perm=[1, 2, 0, 3]),  # (B, nb, C, d_out)
        helper.make_node("Reshape", [f"{p}.ob", f"{p}.shape_final"], [f"{p}.op"]),  # (B, T', d_out)
        helper.make_node("Slice", [f"{p}.op", "hoist.zero", f"{p}.T", "hoist.one"], ["out"]),
    ]


def _hoisted_model(step: onnx.ModelProto, graph: _Hoisted, layout) -> onnx.ModelProto:
    """The assembled nodes as a checked model with the chunk graph's interface and the step graph's
    metadata; only the initialisers some node (or a Scan body) reads are kept."""
    g = step.graph
    inputs, outputs = {i.name: i for i in g.input}, {o.name: o for o in g.output}
    nodes = graph.nodes
    used = {i for x in nodes for i in x.input} | {i for x in nodes for a in x.attribute if a.type == onnx.AttributeProto.GRAPH
                                                  for y in a.g.node for i in y.input}
    outer = helper.make_graph(
        nodes, "hoisted",
        inputs=[_chunk_value_info("tokens", inputs["token"], True)]
        + [_chunk_value_info(s["input"], inputs[s["input"]]) for s in layout],
        outputs=[_chunk_value_info("out", outputs["out"], True)]
        + [_chunk_value_info(s["output"], outputs[s["output"]]) for s in layout],
        initializer=[i for i in list(g.initializer) + graph.extra if i.name in used])
    model = helper.make_model(outer, opset_imports=list(step.opset_import), ir_version=step.ir_version)
    model.metadata_props.extend(step.metadata_props)
    onnx.checker.check_model(model)
    return model
