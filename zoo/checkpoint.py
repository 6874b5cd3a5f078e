"""A checkpoint is a Hub repo folder:

    config.json          entry, task, construction, provenance, file hashes, parameter shapes
    model.safetensors    weights (never pickle)
    eval_results.json    metrics on the frozen test split
    README.md            model card (model_cards/ templates)
    *.png                loss curve, weight matrices
    model_step.onnx, model_chunk.onnx, model.onnx   streaming (token / chunk) and whole-sequence graphs

`Checkpoint` is a huggingface_hub `ModelHubMixin`, so `save_pretrained` / `from_pretrained` /
`push_to_hub` work as for any Hub library. Loading verifies every recorded SHA-256, rebuilds
the model from the embedded entry and loads the weights with strict key and shape checks.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import ModelHubMixin
from safetensors import safe_open
from safetensors.torch import save_file

import zoo
from zoo.models import create_model
from zoo.registry import TASK_ADAPTER, Entry, TaskSpec

FORMAT = "icl-zoo-checkpoint/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
EVAL_RESULTS = "eval_results.json"
HISTORY = "training_history.json"
CONFIG_HASH_KEY = "icl_zoo.config_sha256"  # safetensors metadata: SHA-256 of config.json without its "files"


class CheckpointError(ValueError):
    """A checkpoint folder is incomplete, tampered with, or does not match its architecture."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_core_sha256(config: dict) -> str:
    """SHA-256 of a config without its "files" section (which records the weights' own hash)."""
    core = {k: v for k, v in config.items() if k != "files"}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


def save_weights(state: dict, path: Path, *, config_sha256: str) -> None:
    """safetensors with deterministic bytes: the library writes its metadata map in hash order
    (different from one process to the next), so the header is rewritten with sorted keys."""
    save_file(state, str(path), metadata={"format": "pt", CONFIG_HASH_KEY: config_sha256})
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        canonical = json.dumps(header, separators=(",", ":")).encode()
        if len(canonical) > n:  # cannot happen (same keys, same values); never write a broken file
            raise CheckpointError(f"{path}: canonical safetensors header is longer than the original")
        f.seek(8)
        f.write(canonical + b" " * (n - len(canonical)))


def weights_metadata(path: Path) -> dict:
    """The safetensors header's __metadata__, read without torch (refusing absurd headers)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < n <= 100 * 2**20:
            raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
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


def git_commit() -> str:
    """HEAD of the source tree this code runs from, with "-dirty" when tracked files outside
    `release/` differ from it (the built checkpoint then comes from uncommitted code)."""
    here = Path(__file__).parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)release"],
                                cwd=here.parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class Checkpoint(
    ModelHubMixin,
    library_name="icl-zoo",
    tags=["in-context-learning", "icl-zoo"],
    repo_url="https://github.com/icl-zoo/icl-zoo",
):
    model: torch.nn.Module
    entry: Entry
    task_spec: TaskSpec
    provenance: dict = field(default_factory=dict)  # versions, commit, seed, steps, dataset hashes
    construction: dict | None = None  # hyper-parameters of a constructed model (e.g. η)
    metrics: dict = field(default_factory=dict)  # eval_results.json
    history: list = field(default_factory=list)  # training curve: [{"step", "train_loss", "val_loss"}]

    @property
    def task(self):
        return self.task_spec.build()

    # ------------------------------------------------------------- save
    def _save_pretrained(self, save_directory: Path) -> None:
        from zoo.card import write_card_and_figures

        save_directory = Path(save_directory)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        core = {
            "format": FORMAT,
            "entry": self.entry.model_dump(mode="json"),
            "task": self.task_spec.model_dump(mode="json"),
            "construction": self.construction,
            "provenance": self.provenance,
            "parameters": {k: list(v.shape) for k, v in state.items()},
        }
        # The weights carry the hash of the config they were saved with, and the config the hash of
        # the weights: an edit to either (e.g. construction.eta) is refused on load.
        save_weights(state, save_directory / WEIGHTS, config_sha256=config_core_sha256(core))
        try:
            from icl_zoo_export import export_checkpoint_graphs
        except ImportError:  # export is part of the distribution; tolerate a partial install
            export_checkpoint_graphs = None
        if export_checkpoint_graphs is not None:  # model.onnx always; model_step.onnx + model_chunk.onnx when recurrent
            export_checkpoint_graphs(self, save_directory)
        (save_directory / EVAL_RESULTS).write_text(json.dumps(self.metrics, indent=2, sort_keys=True))
        if self.history:
            (save_directory / HISTORY).write_text(json.dumps(self.history))
        write_config(save_directory, core)
        write_card_and_figures(self, save_directory)

    # ------------------------------------------------------------- load
    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision=None, cache_dir=None, force_download=False,
                         local_files_only=False, token=None, **_config_fields) -> "Checkpoint":
        folder = Path(model_id)
        if not folder.is_dir():
            from zoo.hub import resolve_folder

            folder = resolve_folder(model_id, revision=revision, cache_dir=cache_dir, token=token)
        return read_checkpoint(folder)


HASHED_FILES = (WEIGHTS, EVAL_RESULTS, HISTORY, "model.onnx", "model_step.onnx", "model_chunk.onnx")


def write_config(folder: Path, core: dict) -> None:
    """config.json: the config `core` and the SHA-256 of every hashed file present in `folder`.
    (The weights carry the hash of `core`, not of the file list: graphs re-exported from the same
    weights are recorded without touching them.)"""
    files = {name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
             for name in HASHED_FILES if (folder / name).is_file()}
    (folder / CONFIG).write_text(json.dumps({**core, "files": files}, indent=2))


def verify_files(folder: Path) -> dict:
    """Check a checkpoint folder without building its model: config.json parses, has this format,
    and every file it lists (weights and ONNX graphs) is a regular file inside the folder with
    the recorded SHA-256. Returns the config. Every path that opens a checkpoint starts here."""
    folder = Path(folder)
    if not (folder / CONFIG).exists() and not (folder / CONFIG).is_symlink():
        raise CheckpointError(f"{folder}: no {CONFIG}; not an icl-zoo checkpoint")
    config_path = contained_file(folder, CONFIG)
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{config_path}: format {config.get('format') if isinstance(config, dict) else None!r}, expected {FORMAT!r}")
    files = config.get("files", {})
    if not isinstance(files, dict):
        raise CheckpointError(f"{config_path}: 'files' must map file names to hashes")
    for name, info in files.items():
        path = contained_file(folder, name)  # no '..', no links out, no /dev/zero
        got = sha256_file(path)
        if not isinstance(info, dict) or got != info.get("sha256"):
            raise CheckpointError(
                f"{folder}: {name} has SHA-256 {got}, but {CONFIG} records "
                f"{info.get('sha256') if isinstance(info, dict) else info}; "
                "the file was modified or corrupted — refusing to load it"
            )
    if WEIGHTS not in files:
        raise CheckpointError(f"{folder}: {CONFIG} records no hash for {WEIGHTS}")
    recorded = weights_metadata(contained_file(folder, WEIGHTS)).get(CONFIG_HASH_KEY)
    if recorded is not None and recorded != config_core_sha256(config):
        raise CheckpointError(f"{config_path} was edited after the weights were saved (its hash is "
                              f"{config_core_sha256(config)}, the weights record {recorded}); refusing to load it")
    # Everything the zoo reads from the folder is listed with a hash: graphs, metrics, history.
    for name in HASHED_FILES:
        if ((folder / name).exists() or (folder / name).is_symlink()) and name not in files:
            raise CheckpointError(f"{folder}: {name} is not listed in {CONFIG} with a hash; refusing to use it")
    return config


def _read_json(folder: Path, name: str):
    """A listed (hence verified) JSON file of the checkpoint, or None when absent."""
    if not (folder / name).exists() and not (folder / name).is_symlink():
        return None
    path = contained_file(folder, name)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def read_checkpoint(folder: Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    folder = Path(folder)
    config = verify_files(folder)
    config_path = folder / CONFIG

    from pydantic import ValidationError

    try:
        entry = Entry.model_validate(config["entry"])
        task_spec = TASK_ADAPTER.validate_python(config["task"])
    except (ValidationError, KeyError) as e:
        raise CheckpointError(f"{config_path}: entry/task not understood by icl-zoo {zoo.__version__}:\n{e}") from None

    model = create_model(entry.arch, task_spec.build())
    load_weights_strict(model, folder / WEIGHTS)
    return Checkpoint(
        model=model.to(map_location).eval(),
        entry=entry,
        task_spec=task_spec,
        provenance=config.get("provenance", {}),
        construction=config.get("construction"),
        metrics=_read_json(folder, EVAL_RESULTS) or {},
        history=_read_json(folder, HISTORY) or [],
    )


def load_weights_strict(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors into `model`; any missing, unexpected or mis-shaped tensor is an error."""
    expected = model.state_dict()
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        problems = [f"missing tensor {k}" for k in sorted(set(expected) - keys)]
        problems += [f"unexpected tensor {k}" for k in sorted(keys - set(expected))]
        tensors = {}
        for k in sorted(keys & set(expected)):
            t = f.get_tensor(k)
            if tuple(t.shape) != tuple(expected[k].shape):
                problems.append(f"tensor {k} has shape {tuple(t.shape)}, the architecture needs {tuple(expected[k].shape)}")
            tensors[k] = t
    if problems:
        raise CheckpointError(f"{path}: weights do not match the architecture:\n  " + "\n  ".join(problems))
    model.load_state_dict(tensors, strict=True)


def provenance(seed: int | None, steps: int | None, device: str, dataset_hashes: dict) -> dict:
    return {
        "zoo_version": zoo.__version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "seed": seed,
        "steps": steps,
        "device": device,
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "dataset_hashes": dataset_hashes,
    }
