"""The on-disk contract of a checkpoint folder, checked without torch.

    config.json          format, entry, task, provenance and `files`: the SHA-256 and size of every hashed file
    model.safetensors    weights; its header's metadata records the SHA-256 of config.json without `files`
    eval_results.json, training_history.json, model.onnx, model_step.onnx, model_chunk.onnx

`verify_files` checks a folder against its config.json before anything reads it: the checkpoint
layer (zoo.storage.checkpoint) before it builds a model, the streaming runtime (export) before ONNX
Runtime opens a graph. Standard library only: the safetensors header is 8 bytes of length and JSON.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

FORMAT = "icl-zoo-checkpoint/1"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
EVAL_RESULTS = "eval_results.json"
HISTORY = "training_history.json"
SEQUENCE_FILE = "model.onnx"  # whole sequences
STEP_FILE = "model_step.onnx"  # one token per run, state in and out (recurrent models)
CHUNK_FILE = "model_chunk.onnx"  # a chunk of tokens per run, continued from the state (recurrent models)
GRAPH_FILES = (SEQUENCE_FILE, STEP_FILE, CHUNK_FILE)
HASHED_FILES = (WEIGHTS, EVAL_RESULTS, HISTORY, *GRAPH_FILES)
CARD = "README.md"  # the model card: written after the files it describes (zoo.storage.card), never hashed by config.json
CARD_MARKER = "icl-zoo model card: generated from config.json and eval_results.json; zoo publish re-renders it"
CONFIG_HASH_KEY = "icl_zoo.config_sha256"  # safetensors metadata: SHA-256 of config.json without its "files"
MAX_HEADER = 100 * 2**20
MAX_JSON = 64 * 2**20  # config.json, eval_results.json, history: far above any real one, far below a memory bomb



class CheckpointError(ValueError):
    """A checkpoint folder is incomplete, tampered with, or does not match its architecture."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_json(raw: bytes | str, where) -> object:
    """JSON from an untrusted file: invalid text, bad UTF-8 and nesting deep enough to exhaust the
    parser's recursion are all a CheckpointError naming `where`."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


def read_json_file(path: Path) -> object:
    """`parse_json` of a file no larger than MAX_JSON (checked before it is read)."""
    size = Path(path).stat().st_size
    if size > MAX_JSON:
        raise CheckpointError(f"{path}: {size} bytes, more than the {MAX_JSON} a checkpoint's JSON file may have")
    return parse_json(Path(path).read_bytes(), path)


def config_core_sha256(config: dict) -> str:
    """SHA-256 of a config without its "files" section (which records the weights' own hash)."""
    core = {k: v for k, v in config.items() if k != "files"}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


def safetensors_header(path: Path) -> tuple[int, dict]:
    """(length, header) of a safetensors file: 8 bytes of little-endian length, then that much JSON.
    Absurd lengths and unreadable JSON are refused."""
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < n <= MAX_HEADER:
            raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
        header = parse_json(f.read(n), f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    return n, header


def safetensors_header_bytes(raw: bytes, where) -> tuple[int, dict]:
    """`safetensors_header` of a file's bytes already in memory."""
    n = struct.unpack("<Q", raw[:8])[0] if len(raw) >= 8 else -1
    if not 0 < n <= min(MAX_HEADER, len(raw) - 8):
        raise CheckpointError(f"{where}: not a safetensors file (header length {n})")
    header = parse_json(raw[8:8 + n], f"{where}: safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: the safetensors header is not a JSON object")
    return n, header


def weights_metadata_bytes(raw: bytes, where) -> dict:
    """The safetensors header's __metadata__, from the file's bytes."""
    meta = safetensors_header_bytes(raw, where)[1].get("__metadata__", {})
    return meta if isinstance(meta, dict) else {}


def weights_metadata(path: Path) -> dict:
    """The safetensors header's __metadata__."""
    header = safetensors_header(path)[1]
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return meta if isinstance(meta, dict) else {}


def contained_file(folder: Path, name: str) -> Path:
    """`folder/name` as a regular file that stays inside the folder, else CheckpointError.

    A name with a path separator or '..', a special file (a FIFO, /dev/zero) and a symlink that leaves
    the folder are refused. The one symlink allowed is a huggingface_hub cache snapshot's link to its
    blob (snapshots/<rev>/<file> → ../../blobs/<sha>), which stays in the repo's cache folder."""
    folder = Path(folder)
    if not name or name != Path(name).name or name in (".", ".."):
        raise CheckpointError(f"{folder}: file name {name!r} is not a plain file name; refusing it")
    path = folder / name
    if path.is_symlink():
        target, cache_repo = path.resolve(), folder.resolve().parent.parent
        if folder.resolve().parent.name != "snapshots" or cache_repo / "blobs" != target.parent:
            raise CheckpointError(f"{path} is a symbolic link out of the checkpoint; refusing it")
        path = target
    if not path.exists():
        raise CheckpointError(f"{folder}: file {name} is missing")
    if not path.is_file():
        raise CheckpointError(f"{folder}: {name} is not a regular file; refusing it")
    return path


def _present(folder: Path, name: str) -> bool:
    return (folder / name).exists() or (folder / name).is_symlink()


def write_config(folder: Path, core: dict) -> None:
    """config.json: the config `core` and the SHA-256 of every hashed file present in `folder`.
    (The weights carry the hash of `core`, not of the file list: graphs re-exported from the same
    weights are recorded without touching them.)"""
    folder = Path(folder)
    files = {name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
             for name in HASHED_FILES if (folder / name).is_file()}
    (folder / CONFIG).write_text(json.dumps({**core, "files": files}, indent=2))


def read_config_core(folder: Path) -> dict:
    """config.json of `folder` without its "files" section (to re-record the hashes with `write_config`)."""
    config = read_json_file(Path(folder) / CONFIG)
    if not isinstance(config, dict):
        raise CheckpointError(f"{Path(folder) / CONFIG}: not a JSON object")
    return {k: v for k, v in config.items() if k != "files"}


MAX_FILE = 256 * 2**20  # bytes of any one checkpoint file read into memory: the whole zoo is < 40 MiB
SELF_CONSISTENT = "self-consistent, not checked against a release"


@dataclass(frozen=True)
class VerifiedFolder:
    """A checkpoint folder whose files were read once, hashed, and checked: `data` holds the bytes that
    were hashed (parse these, never the disk again: no time-of-check/time-of-use gap).

    `data` has config.json and every file it lists. `release` is the release version (e.g. "v0.2.0") when every file matched the shipped
    `release/index.json` (the trust root); None when the folder was only checked against its own
    config.json, which anyone can rewrite: then it is "self-consistent, not checked against a release"."""

    folder: Path
    config: dict
    data: dict[str, bytes]
    release: str | None = None

    @property
    def trust(self) -> str:
        return f"verified against release {self.release}" if self.release else SELF_CONSISTENT

    def json(self, name: str):
        """A listed JSON file, parsed from the hashed bytes; None when the folder has no such file."""
        return parse_json(self.data[name], self.folder / name) if name in self.data else None


class FileReader:
    """Reads each file of a folder at most once (size-capped, regular files inside the folder only)
    and remembers its bytes and SHA-256, so that checking a folder against its config.json and
    against the release index hashes every file once."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._bytes: dict[str, bytes] = {}
        self._sha: dict[str, str] = {}

    def read(self, name: str, limit: int = MAX_FILE) -> bytes:
        if name not in self._bytes:
            path = contained_file(self.folder, name)
            with open(path, "rb") as f:
                raw = f.read(limit + 1)  # never more than the cap, whatever the file claims to be
            if len(raw) > limit:
                raise CheckpointError(f"{path}: more than the {limit} bytes a checkpoint file may have; refusing it")
            self._bytes[name] = raw
        return self._bytes[name]

    def sha256(self, name: str) -> str:
        if name not in self._sha:
            self._sha[name] = hashlib.sha256(self.read(name)).hexdigest()
        return self._sha[name]


def verify_files(folder: Path, *, reader: FileReader | None = None, release: str | None = None) -> VerifiedFolder:
    """Check a checkpoint folder without building its model: config.json parses, has this format,
    and every file it lists (weights and ONNX graphs) is a regular file inside the folder with
    the recorded SHA-256. Every path that opens a checkpoint starts here. `reader`: the files already
    read (and hashed) by a release check (zoo.storage.locate), whose version is passed as `release`."""
    folder = Path(folder)
    reader = reader or FileReader(folder)
    if not _present(folder, CONFIG):
        raise CheckpointError(f"{folder}: no {CONFIG}; not an icl-zoo checkpoint")
    config_path = folder / CONFIG
    config = parse_json(reader.read(CONFIG, MAX_JSON), config_path)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{config_path}: format {config.get('format') if isinstance(config, dict) else None!r}, expected {FORMAT!r}")
    files = config.get("files", {})
    if not isinstance(files, dict):
        raise CheckpointError(f"{config_path}: 'files' must map file names to hashes")
    for name, info in files.items():
        got = reader.sha256(name)  # no '..', no links out, no /dev/zero (contained_file)
        if not isinstance(info, dict) or got != info.get("sha256"):
            raise CheckpointError(
                f"{folder}: {name} has SHA-256 {got}, but {CONFIG} records "
                f"{info.get('sha256') if isinstance(info, dict) else info}; "
                "the file was modified or corrupted — refusing to load it"
            )
    if WEIGHTS not in files:
        raise CheckpointError(f"{folder}: {CONFIG} records no hash for {WEIGHTS}")
    recorded = weights_metadata_bytes(reader.read(WEIGHTS), folder / WEIGHTS).get(CONFIG_HASH_KEY)
    if recorded is None and release is not None:  # every released entry was saved with the key
        raise CheckpointError(f"{folder / WEIGHTS}: no {CONFIG_HASH_KEY} in its metadata; a released entry's weights "
                              "always record the hash of their config.json")
    if recorded is not None and recorded != config_core_sha256(config):
        raise CheckpointError(f"{config_path} was edited after the weights were saved (its hash is "
                              f"{config_core_sha256(config)}, the weights record {recorded}); refusing to load it")
    # Everything the zoo reads from the folder is listed with a hash: graphs, metrics, history.
    for name in HASHED_FILES:
        if _present(folder, name) and name not in files:
            raise CheckpointError(f"{folder}: {name} is not listed in {CONFIG} with a hash; refusing to use it")
    return VerifiedFolder(folder, config, {CONFIG: reader.read(CONFIG), **{name: reader.read(name) for name in files}}, release)


def read_json(folder: Path, name: str):
    """A listed (hence hash-checked) JSON file of the checkpoint, or None when absent."""
    folder = Path(folder)
    if not _present(folder, name):
        return None
    return read_json_file(contained_file(folder, name))
