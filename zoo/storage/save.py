"""Saving a checkpoint's whole Hub repo folder: storage's job, in one staged folder swapped in whole.

    files    weights, eval results, history, config.json with every file's SHA-256 (`Checkpoint.save_files`)
    graphs   the ONNX graphs, written by the writer the caller passes (`export.onnx_export.export_checkpoint_graphs`
             from the floors above; this floor never imports the exporter), their hashes recorded here
    card     README.md and its figures, rendered from the checkpoint's own data once its files are saved

An error or a kill at any point leaves the folder's previous checkpoint loadable (zoo.storage.atomic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from zoo.storage.atomic import replace_folder
from zoo.storage.card import write_card_and_figures
from zoo.storage.manifest import CARD, CONFIG, HASHED_FILES, read_config_core, write_config

# The exporter's contract: write a checkpoint's ONNX graphs into a folder, return the paths written.
GraphWriter = Callable[[object, Path], Iterable[Path]]

# What a save writes, hence never carried over from the folder it replaces: a stale history or graph
# would otherwise be listed with a hash for weights it does not belong to.
ZOO_FILES = frozenset({CONFIG, CARD, *HASHED_FILES})


def not_zoo_file(name: str) -> bool:
    """Kept from the folder a save replaces: a user's notes, `.train/` (resumable training state), figures."""
    return name not in ZOO_FILES


def save_checkpoint(ckpt, folder: Path, *, graphs: GraphWriter | None, keep: Callable[[str], bool] = not_zoo_file,
                    card: bool = True, phase: Callable[[str], None] | None = None) -> Path:
    """Write the checkpoint's whole Hub repo folder: its own files, `graphs(ckpt, folder)` when given (None:
    no ONNX graph, as `zoo build --no-graphs`; `zoo export FOLDER` adds them later), every file's SHA-256 in
    config.json, then the card rendered from those files (`card=False`: none).

    Written into a hidden sibling and swapped in whole: of the previous folder, the entries `keep(name)`
    accepts and the new save did not write are copied over (by default everything but the zoo's own files);
    `keep=lambda name: False` replaces the folder entirely. `phase(text)`, when given, is told each step as it
    starts (the graphs' export and the card's figures take seconds: `zoo build` says so)."""
    say = phase or (lambda text: None)

    def write(staged: Path) -> None:
        say("saving the weights and exporting the ONNX graphs" if graphs is not None else "saving the weights")
        ckpt.save_files(staged, graphs=graphs)
        if card:
            say("writing the card and its figures")
            write_card_and_figures(ckpt, staged)

    replace_folder(folder, write, keep=keep)
    return Path(folder)


def add_graphs(ckpt, folder: Path, graphs: GraphWriter) -> list[Path]:
    """Write the graphs of the checkpoint saved in `folder` (re-exported from its weights) and record their
    hashes in its config.json; the weights, which carry the hash of the config without them, are untouched.
    The card, which lists the graphs, is the caller's to re-render."""
    written = list(graphs(ckpt, Path(folder)))
    write_config(Path(folder), read_config_core(Path(folder)))
    return written
