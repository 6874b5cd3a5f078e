"""The step graph wrapped in an ONNX `Scan` over time: a chunk graph for models without a parallel
form, and for a runtime given only a step graph. Needs onnx, not torch (the streaming runtime
builds it in memory)."""

from __future__ import annotations

import json

import onnx


def scan_step_graph(step: onnx.ModelProto) -> onnx.ModelProto:
    """The step graph wrapped in an ONNX `Scan` over time: a chunk graph with the chunk graph's
    names, (tokens (B, T, d_in), state_in.* ...) -> (out (B, T, d_out), state_out.* ...), that runs
    the step graph's own nodes T times inside ONNX Runtime (one `run` per chunk instead of one per
    token). Exact for any T by construction: the same operators, in the same order, as the step
    graph. (The exported file's metadata is set by `export_chunk`; a runtime given only a step
    graph builds this in memory.)"""
    from onnx import helper

    g = step.graph
    layout = json.loads({p.key: p.value for p in step.metadata_props}["icl_zoo.state_layout"])
    # The body's interface is renamed (step.*): a subgraph may not reuse the outer graph's names.
    rename = {"token": "step.token", "out": "step.out"}
    rename |= {s[k]: f"step.{s[k]}" for s in layout for k in ("input", "output")}
    body_nodes = []
    for node in g.node:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
        body_nodes.append(node)

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

    def value_info(name, like, timed=False):
        t = like.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return helper.make_tensor_value_info(name, t.elem_type, [dims[0], "time", *dims[1:]] if timed else dims)

    outer = helper.make_graph(
        [scan], "chunk",
        inputs=[value_info("tokens", inputs["token"], True)] + [value_info(s["input"], inputs[s["input"]]) for s in layout],
        outputs=[value_info("out", outputs["out"], True)] + [value_info(s["output"], outputs[s["output"]]) for s in layout])
    model = helper.make_model(outer, opset_imports=list(step.opset_import), functions=list(step.functions),
                              ir_version=step.ir_version)
    onnx.checker.check_model(model)
    return model
