"""ONNX export of zoo models and the constant-memory streaming runtime.

    from zoo.export.streaming import StreamingSession     # onnxruntime + numpy; no torch
    from zoo.export.onnx_export import save_checkpoint    # a checkpoint folder with its ONNX graphs (torch)

The streaming runtime (streaming.py, scan_graph.py, graph_files.py, token_io.py) resolves and
hash-checks a checkpoint through zoo.locate and zoo.manifest, which import no torch, and this package
imports nothing on its own: `import zoo.export.streaming` loads no torch. The exporter
(onnx_export.py) needs torch and the zoo's models. Imports run one way: this package uses the zoo's
lower layers (manifest, locate, atomic, models.scan); the builder, release and CLI use this package.
"""
