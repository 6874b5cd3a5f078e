"""The release: every registry entry's checkpoint, built, indexed, shipped with the package and served.

    release/
      index.json, INDEX.md       one row per entry: steps run vs recipe, device, commit, hashes,
                                 metrics against the entry's `expected` paper values, verdict
      <entry>/                   exactly the entry's Hub repo: config.json, model.safetensors,
                                 model.onnx (+ model_step.onnx), README.md card, figures,
                                 eval_results.json, training_history.json
      .work/                     build folders with resumable training state (never shipped)

`zoo release build` fills it entry by entry (resumable; an entry whose recipe changed is rebuilt),
`zoo hub serve` serves it as `icl-zoo/<entry>` model repos tagged with the release version,
`zoo.load("<entry>")` loads a released checkpoint by bare name, hash-verified against the index.

    plan.py      what a build runs: definition fingerprint, measured rate, run length, training mode
    build.py     building entries and the release (`zoo release build`), re-rendering it (`refresh`)
    index.py     index rows, index.json and INDEX.md, whether a released folder is current
    archive.py   the release as one .tar.gz, and its checked unpacking
    publish.py   the release on the local hub or a real Hub

Each name below is imported from its module on first use (`release.write_archive`): the registry and the
builder import torch, and `zoo release archive` / `unpack` load only archive.py.
"""

from __future__ import annotations

import importlib

from zoo.storage.locate import INDEX_JSON, INDEX_MD, ORG, VERSION, ReleaseError, read_index, release_dir, verify_folder

_MODULE_OF = {name: module for module, names in {
    "plan": ["MIN_STEPS", "PROBE_STEPS", "entry_fingerprint", "measure_rate", "print_plan", "run_length",
             "training_mode"],
    "build": ["SHIPPED", "WORK", "build_entry", "build_release", "make_entry", "make_entry_announced", "refresh_release",
              "ship_entry"],
    "index": ["index_markdown", "index_row", "is_adoptable", "is_current", "released_folder", "resolve",
              "run_summary", "shortfall_note", "write_index"],
    "archive": ["ARCHIVE_ROOT", "MAX_ARCHIVE_BYTES", "MAX_MEMBERS", "MAX_MEMBER_BYTES", "MAX_TAR_STREAM",
                "NOT_AN_ARCHIVE", "unpack_archive", "write_archive"],
    "publish": ["import_to_hub", "publish_release"],
}.items() for name in names}


def __getattr__(name: str):
    """`release.<name>` from the module that defines it, imported on first use and looked up there every
    time (not cached here): a test patches the defining module (zoo.publishing.release.archive.MAX_MEMBERS),
    where its own functions look the name up, and `release.<name>` returns the patched value too."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = ["INDEX_JSON", "INDEX_MD", "ORG", "VERSION", "ReleaseError", "read_index", "release_dir", "verify_folder",
           *_MODULE_OF]
