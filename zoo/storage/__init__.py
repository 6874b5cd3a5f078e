"""The storage-and-trust floor: a checkpoint as a Hub repo folder, written atomically, found, and checked.

    manifest     the on-disk contract (file names, hashes, config.json) and verification; no torch
    locate       where a checkpoint is (folder, repo id, bare entry name) and how far it is trusted; no torch
    checkpoint   `Checkpoint`: build the model from hash-checked bytes; `save_checkpoint` writes the whole folder
    loading      `zoo.load`
    card         the model card, rendered from the checkpoint's own files
    atomic       staged writes and folder swaps

It uses only the science floor. The ONNX graphs are the export package's: a save takes its graph writer as
an argument (`save_checkpoint(..., graphs=...)`), so storage never imports export.
"""
