"""A checkpoint is a Hub repo folder:

    config.json          entry, task, construction, provenance, file hashes, parameter shapes
    model.safetensors    weights (never pickle)
    eval_results.json    metrics on the frozen test split
    README.md            model card (zoo.storage.card, from model_cards/ templates), written after this layer's files
    *.png                loss curve, weight matrices (the card's figures)
    model_step.onnx, model_chunk.onnx, model.onnx   streaming (token / chunk) and whole-sequence graphs

`Checkpoint` is a huggingface_hub `ModelHubMixin`: `from_pretrained` works as for any Hub library, from a
folder or a repo id (`Checkpoint.from_pretrained("icl-zoo/lsa-d10-c10")`), and `save_pretrained` writes the
folder without graphs (and with huggingface_hub's short card); `push_to_hub` is refused, since a repo without its
step graph cannot stream (publish a built folder with `zoo publish`). Loading verifies every recorded SHA-256
(zoo.storage.manifest, torch-free), rebuilds the model from the embedded entry and loads the weights with strict key and
shape checks.

`Checkpoint.save_files` writes the checkpoint's own files and nothing else: it renders no card and writes no
ONNX. The whole folder, graphs and card included, is `zoo.storage.save.save_checkpoint`, which takes the
exporter's graph writer from the floors above (`zoo.running.builder.save(ckpt, folder)` passes it).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from huggingface_hub import ModelHubMixin
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file

from zoo.science.models import create_model
from zoo.science.registry import TASK_ADAPTER, Entry, TaskSpec
from zoo.storage.manifest import (  # noqa: F401  (the on-disk contract, re-exported: zoo.storage.checkpoint is where callers look)
    CARD,
    CARD_MARKER,
    CONFIG,
    CONFIG_HASH_KEY,
    EVAL_RESULTS,
    FORMAT,
    GRAPH_FILES,
    HASHED_FILES,
    HISTORY,
    SELF_CONSISTENT,
    WEIGHTS,
    CheckpointError,
    VerifiedFolder,
    config_core_sha256,
    contained_file,
    read_json,
    safetensors_header,
    sha256_file,
    verify_files,
    weights_metadata,
    write_config,
)
from zoo.version import __version__


def save_weights(state: dict, path: Path, *, config_sha256: str) -> None:
    """safetensors with deterministic bytes: the library writes its metadata map in hash order
    (different from one process to the next), so the header is rewritten with sorted keys."""
    save_file(state, str(path), metadata={"format": "pt", CONFIG_HASH_KEY: config_sha256})
    n, header = safetensors_header(path)
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    canonical = json.dumps(header, separators=(",", ":")).encode()
    if len(canonical) > n:  # cannot happen (same keys, same values); never write a broken file
        raise CheckpointError(f"{path}: canonical safetensors header is longer than the original")
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(canonical + b" " * (n - len(canonical)))


def git_commit() -> str:
    """HEAD of the source tree this code runs from, with "-dirty" when tracked files outside
    `release/` differ from it (the built checkpoint then comes from uncommitted code). A copy of the
    tree without its .git folder (a GPU machine's) is "unknown" unless ICL_ZOO_COMMIT names the commit
    it was copied from (scripts/gpu_paper_length_runs.sh sets it)."""
    here = Path(__file__).parents[1]  # the package folder, zoo/
    fallback = os.environ.get("ICL_ZOO_COMMIT") or "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return fallback
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)release"],
                                cwd=here.parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


# The card huggingface_hub's `save_pretrained` writes (ModelHubMixin.generate_model_card): this layer renders
# none of its own; the full card comes with `zoo build`, `zoo export` and `zoo publish`.
SHORT_CARD = """---
{{ card_data }}
---

An [icl-zoo]({{ repo_url }}) checkpoint saved with `save_pretrained`: weights, config.json and eval_results.json,
without ONNX graphs. Load it with `zoo.load(folder)` or `Checkpoint.from_pretrained(folder)`; `zoo export folder`
adds the graphs and the full model card.
"""


@dataclass
class Checkpoint(
    ModelHubMixin,
    library_name="icl-zoo",
    tags=["in-context-learning", "icl-zoo"],
    repo_url="https://github.com/icl-zoo/icl-zoo",
    model_card_template=SHORT_CARD,
):
    model: torch.nn.Module
    entry: Entry
    task_spec: TaskSpec
    provenance: dict = field(default_factory=dict)  # versions, commit, seed, steps, dataset hashes
    construction: dict | None = None  # hyper-parameters of a constructed model (e.g. η)
    metrics: dict = field(default_factory=dict)  # eval_results.json
    history: list = field(default_factory=list)  # training curve: [{"step", "train_loss", "val_loss"}]
    trust: str = SELF_CONSISTENT  # how the loaded files were checked: "verified against release vX" or self-consistent only

    @property
    def task(self):
        return self.task_spec.build()

    def predict(self, tokens) -> torch.Tensor:
        """The model's read-out prediction for `tokens` (B, T, d_in) in the task's layout (a tensor or an
        array): in eval mode, under `torch.inference_mode`, so the result carries no autograd graph
        (`requires_grad` False, no `grad_fn`). `ckpt.model` stays an ordinary module for training and
        gradients (`ckpt.model.predict` keeps the graph)."""
        param = next(self.model.parameters(), None)
        self.model.eval()
        with torch.inference_mode():
            tokens = torch.as_tensor(tokens)
            if param is not None:
                tokens = tokens.to(device=param.device, dtype=param.dtype)
            return self.model.predict(tokens)

    # ------------------------------------------------------------- save
    def _save_pretrained(self, save_directory: Path) -> None:
        """`save_pretrained` (huggingface_hub): the folder without ONNX graphs; huggingface_hub then writes its
        short card where the folder has none. A generated zoo card left from an earlier save describes other
        files (graphs this save removes), so it goes; a hand-written README.md stays. The full Hub repo folder,
        graphs and card included, is `zoo.running.builder.save(ckpt, folder)` (`zoo export`)."""
        self.save_files(save_directory)
        card = Path(save_directory) / CARD
        if card.is_file() and not card.is_symlink() and CARD_MARKER in card.read_text(errors="replace"):
            card.unlink()

    def save_files(self, folder: Path, *, graphs: Callable[[Checkpoint, Path], object] | None = None) -> Path:
        """Write the checkpoint's own files into `folder`: weights, `graphs(self, folder)` (the export layer's
        ONNX writer, passed from above), eval results, history, config.json with the hash of every file
        written. Without `graphs` the folder holds no graphs: ones left from an earlier save are removed,
        never recorded for these weights. No card: the layer above renders it from these files."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        core = {
            "format": FORMAT,
            # what the weights are made from and what they are; the expected values and their tolerances are the
            # registry's, shown by the card and the release index (one source): never a second copy here
            "entry": self.entry.model_dump(mode="json", exclude={"expected"}),
            "task": self.task_spec.model_dump(mode="json"),
            "construction": self.construction,
            "provenance": self.provenance,
            "parameters": {k: list(v.shape) for k, v in state.items()},
        }
        # The weights carry the hash of the config they were saved with, and the config the hash of
        # the weights: an edit to either (e.g. construction.eta) is refused on load.
        save_weights(state, folder / WEIGHTS, config_sha256=config_core_sha256(core))
        # model.onnx always; model_step.onnx + model_chunk.onnx when recurrent. A graph this save did
        # not write is removed only now, after the writer succeeded: a failed export leaves the folder's
        # earlier graphs, still listed with their hashes, instead of a config.json naming missing files.
        written = {Path(p).name for p in (graphs(self, folder) or [])} if graphs is not None else set()
        for name in GRAPH_FILES:
            if name not in written:
                (folder / name).unlink(missing_ok=True)
        (folder / EVAL_RESULTS).write_text(json.dumps(self.metrics, indent=2, sort_keys=True))
        if self.history:
            (folder / HISTORY).write_text(json.dumps(self.history))
        write_config(folder, core)
        return folder

    def push_to_hub(self, repo_id: str, **_kwargs):
        raise NotImplementedError(
            f"a zoo checkpoint is published with its ONNX graphs, which this layer does not write: "
            f"`zoo.running.builder.save(ckpt, folder)` (zoo.storage.save.save_checkpoint with the exporter's graphs), then "
            f"`zoo publish folder --repo {repo_id} --hub hf`"
        )

    # ------------------------------------------------------------- load
    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision=None, cache_dir=None, force_download=False,
                         local_files_only=False, token=None, **_config_fields) -> "Checkpoint":
        """huggingface_hub's `from_pretrained`: a folder, or a Hub repo downloaded by huggingface_hub itself
        (which validates the repo id); either way every file is hash-checked before a model is built."""
        folder = Path(model_id)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_id, revision=revision, cache_dir=cache_dir, token=token,
                                            force_download=force_download, local_files_only=local_files_only))
        return read_checkpoint(folder)


def read_checkpoint(folder: Path | VerifiedFolder, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Build the checkpoint from a folder (checked against its own config.json here) or from the files
    `zoo.storage.locate` already read and checked; the model is built from those same bytes."""
    verified = folder if isinstance(folder, VerifiedFolder) else verify_files(Path(folder))
    folder, config = verified.folder, verified.config
    config_path = folder / CONFIG

    from pydantic import ValidationError

    try:
        entry = Entry.model_validate(config["entry"])
        task_spec = TASK_ADAPTER.validate_python(config["task"])
    except (ValidationError, KeyError) as e:
        raise CheckpointError(f"{config_path}: entry/task not understood by icl-zoo {__version__}:\n{e}") from None

    model = create_model(entry.arch, task_spec.build())
    load_weights_strict(model, verified.data[WEIGHTS], folder / WEIGHTS)
    return Checkpoint(
        model=model.to(map_location).eval(),
        entry=entry,
        task_spec=task_spec,
        provenance=config.get("provenance", {}),
        construction=config.get("construction"),
        metrics=verified.json(EVAL_RESULTS) or {},
        history=verified.json(HISTORY) or [],
        trust=verified.trust,
    )


def load_weights_strict(model: torch.nn.Module, raw: bytes | Path, where: Path | None = None) -> None:
    """Load safetensors (the file's bytes, as hashed, or a path) into `model`; any missing, unexpected or
    mis-shaped tensor is an error."""
    if isinstance(raw, Path):
        raw, where = raw.read_bytes(), raw
    expected = model.state_dict()
    try:
        loaded = safetensors_load(raw)
    except Exception as e:  # a hashed but malformed file (hand-made self-consistent repo): one line, no traceback
        raise CheckpointError(f"{where}: not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})") from None
    keys = set(loaded)
    problems = [f"missing tensor {k}" for k in sorted(set(expected) - keys)]
    problems += [f"unexpected tensor {k}" for k in sorted(keys - set(expected))]
    tensors = {}
    for k in sorted(keys & set(expected)):
        t = loaded[k]
        if tuple(t.shape) != tuple(expected[k].shape):
            problems.append(f"tensor {k} has shape {tuple(t.shape)}, the architecture needs {tuple(expected[k].shape)}")
        tensors[k] = t
    if problems:
        raise CheckpointError(f"{where}: weights do not match the architecture:\n  " + "\n  ".join(problems))
    model.load_state_dict(tensors, strict=True)


def provenance(seed: int | None, steps: int | None, device: str, dataset_hashes: dict) -> dict:
    return {
        "zoo_version": __version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "seed": seed,
        "steps": steps,
        "device": device,
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "dataset_hashes": dataset_hashes,
    }
