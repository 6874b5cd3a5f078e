"""ONNX export of zoo models and the constant-memory streaming runtime."""

from export.onnx_export import (
    OPSET, SEQUENCE_FILE, STEP_FILE, chunk_graph, export_checkpoint_graphs, export_sequence, export_step,
)
from export.streaming import StreamError, StreamingSession

__all__ = [
    "OPSET", "SEQUENCE_FILE", "STEP_FILE", "StreamError", "StreamingSession", "chunk_graph",
    "export_checkpoint_graphs", "export_sequence", "export_step",
]
