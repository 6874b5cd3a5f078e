"""ONNX export of zoo models and the constant-memory streaming runtime.

    from icl_zoo_export import StreamingSession      # onnxruntime + numpy; no torch
    from icl_zoo_export import save_checkpoint       # a checkpoint folder with its ONNX graphs (torch)

The streaming runtime (streaming.py, scan_graph.py) resolves and hash-checks a checkpoint through
zoo.locate and zoo.manifest, which import no torch; the exporter (onnx_export.py) needs torch and
the zoo's models, and is imported on first use of one of its names.
"""

from icl_zoo_export.streaming import StreamError, StreamingSession
from zoo.manifest import CHUNK_FILE, SEQUENCE_FILE, STEP_FILE

LAZY = {  # name → the submodule that defines it, imported on first use
    **dict.fromkeys(("OPSET", "export_checkpoint_graphs", "export_chunk", "export_sequence", "export_step",
                     "save_checkpoint", "write_graphs"), "onnx_export"),
    "scan_step_graph": "scan_graph",
}


def __getattr__(name: str):
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(f"icl_zoo_export.{LAZY[name]}"), name)
    raise AttributeError(f"module 'icl_zoo_export' has no attribute {name!r}")


__all__ = ["CHUNK_FILE", "SEQUENCE_FILE", "STEP_FILE", "StreamError", "StreamingSession", *LAZY]
