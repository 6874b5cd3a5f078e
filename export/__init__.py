"""ONNX export of zoo models and the constant-memory streaming runtime.

    from icl_zoo_export import StreamingSession      # onnxruntime + numpy; no torch
    from icl_zoo_export import save_checkpoint       # a checkpoint folder with its ONNX graphs (torch)

The streaming runtime (streaming.py, scan_graph.py) resolves and hash-checks a checkpoint through
zoo.locate and zoo.manifest, which import no torch; the exporter (onnx_export.py) needs torch and
the zoo's models, and is imported on first use of one of its names.
"""

from icl_zoo_export.streaming import StreamError, StreamingSession
from zoo.manifest import CHUNK_FILE, SEQUENCE_FILE, STEP_FILE

EXPORTER = ("OPSET", "export_checkpoint_graphs", "export_chunk", "export_sequence", "export_step",
            "save_checkpoint", "write_graphs")


def __getattr__(name: str):  # imported on first use
    if name in EXPORTER:
        from icl_zoo_export import onnx_export

        return getattr(onnx_export, name)
    if name == "scan_step_graph":
        from icl_zoo_export.scan_graph import scan_step_graph

        return scan_step_graph
    raise AttributeError(f"module 'icl_zoo_export' has no attribute {name!r}")


__all__ = ["CHUNK_FILE", "SEQUENCE_FILE", "STEP_FILE", "StreamError", "StreamingSession", "scan_step_graph", *EXPORTER]
