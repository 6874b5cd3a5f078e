"""What an icl-zoo ONNX graph may be, checked on its bytes before ONNX Runtime opens it.

The zoo's exporter writes self-contained fp32 graphs of standard ONNX operators. A graph that
keeps tensors in an external-data sidecar (a file beside it that no hash covers, or a path that
escapes the folder) or that calls operators from another domain (custom ops, contrib kernels)
is not one of the zoo's and is refused with one line, before any runtime sees it.
"""

from __future__ import annotations

import math
from pathlib import Path

STANDARD_DOMAINS = ("", "ai.onnx")


def is_readout(r, d_out: int | None = None) -> bool:
    """Is `r` (the parsed icl_zoo.readout metadata) a read-out: integer start and stop with
    0 ≤ start < stop (≤ d_out when given), a finite number sign, and a position that is an integer or
    null when present. The streaming runtime and the open benchmark both check graphs with it."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if not isinstance(r, dict):
        return False
    start, stop, sign, position = r.get("start"), r.get("stop"), r.get("sign"), r.get("position", -1)
    return (is_int(start) and is_int(stop) and 0 <= start < stop and (d_out is None or stop <= d_out)
            and isinstance(sign, (int, float)) and not isinstance(sign, bool) and math.isfinite(sign)
            and (position is None or is_int(position)))


class GraphFileError(ValueError):
    """A graph file is not a self-contained icl-zoo graph."""


def _tensors(graph):
    """Every tensor stored in `graph` and its subgraphs (initialisers and constant attributes)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def check_graph_bytes(raw: bytes, where: Path | str) -> None:
    """Refuse a graph that is not a self-contained graph of standard ONNX operators (see above)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.ModelProto.FromString(raw)  # parses only: never follows an external-data path
    except (DecodeError, ValueError, RuntimeError) as e:
        raise GraphFileError(f"{where}: not an ONNX model ({type(e).__name__}: {str(e)[:200]})") from None
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
            raise GraphFileError(f"{where}: tensor {tensor.name!r} keeps its data in an external file, which no hash "
                                 "covers; icl-zoo graphs are self-contained. Refusing it")
    for node in _nodes(model.graph):
        if node.domain not in STANDARD_DOMAINS:
            raise GraphFileError(f"{where}: node {node.name or node.op_type!r} uses operator domain {node.domain!r}; "
                                 "icl-zoo graphs use standard ONNX operators only. Refusing it")
    for function in model.functions:
        raise GraphFileError(f"{where}: defines local function {function.name!r}; icl-zoo graphs have none. Refusing it")
