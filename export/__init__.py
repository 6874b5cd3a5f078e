"""ONNX export of zoo models and the constant-memory streaming runtime (its own import package, between
the zoo's floors).

    from export.streaming import StreamingSession        # onnxruntime + numpy; no torch
    from export.onnx_export import export_checkpoint_graphs   # a checkpoint's graphs (torch)

The streaming runtime (streaming.py, scan_graph.py, graph_files.py, token_io.py) resolves and hash-checks
a checkpoint through zoo.storage.locate and zoo.storage.manifest, which import no torch, and this package
imports nothing on its own: `import export.streaming` loads no torch. The exporter (onnx_export.py) needs
torch and the zoo's models. Imports run one way: this package uses the zoo's science and storage floors;
the running, publishing and CLI floors use it (import-linter contracts in pyproject.toml).
"""
