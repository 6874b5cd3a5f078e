"""ONNX export of zoo models and the constant-memory streaming runtime."""

from icl_zoo_export.onnx_export import (
    CHUNK_FILE,
    OPSET,
    SEQUENCE_FILE,
    STEP_FILE,
    export_checkpoint_graphs,
    export_chunk,
    export_sequence,
    export_step,
    scan_step_graph,
)
from icl_zoo_export.streaming import StreamError, StreamingSession

__all__ = [
    "CHUNK_FILE", "OPSET", "SEQUENCE_FILE", "STEP_FILE", "StreamError", "StreamingSession",
    "export_checkpoint_graphs", "export_chunk", "export_sequence", "export_step", "scan_step_graph",
]
