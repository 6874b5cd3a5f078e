"""A checkpoint is a Hub repo folder:

    config.json          entry, task, construction, provenance, file hashes, parameter shapes
    model.safetensors    weights (never pickle)
    eval_results.json    metrics on the frozen test split
    README.md            model card (zoo.storage.card, from model_cards/ templates), written after this layer's files
    *.png                loss curve, weight matrices (the card's figures)
    model_step.onnx, model_chunk.onnx, model.onnx   streaming (token / chunk) and whole-sequence graphs

`Checkpoint` is a huggingface_hub `ModelHubMixin`: `from_pretrained` takes a folder, a repo id or a bare entry
name (`Checkpoint.from_pretrained("icl-zoo/lsa-d10-c10")`, `Checkpoint.from_pretrained("lsa-d10-c10")`) and
resolves it exactly as `zoo.load` does (`open_checkpoint`: zoo.storage.locate validates the id, downloads only the
checkpoint's own files, checks a released entry against the shipped release index, and the model is built from the
bytes that were hashed). `save_pretrained` writes the folder without ONNX graphs, which this floor cannot write (the
exporter is above it): its short card and a warning name the graphs left out and `zoo export FOLDER`, which adds
them. `push_to_hub` uploads such a folder to any Hub endpoint (create_repo + upload_folder), saying the same; the
local hub is written by `zoo publish`. Loading checks every recorded SHA-256 (zoo.storage.manifest, torch-free),
rebuilds the model from the embedded entry and loads the weights with strict key and shape checks.

`Checkpoint.save_files` writes the checkpoint's own files and nothing else: it renders no card and writes no
ONNX. The whole folder, graphs and card included, is `zoo.storage.save.save_checkpoint`, which takes the
exporter's graph writer from the floors above (`zoo.running.builder.save(ckpt, folder)` passes it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from huggingface_hub import ModelHubMixin
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from safetensors.torch import save_file

from zoo.science.models import create_model
from zoo.science.registry import TASK_ADAPTER, Entry, TaskSpec, default_registry, unknown_entry_error
from zoo.storage.locate import HubError, locate, validate_repo_id
from zoo.storage.manifest import (  # noqa: F401  (the on-disk contract, re-exported: zoo.storage.checkpoint is where callers look)
    CARD,
    CARD_MARKER,
    CHUNK_FILE,
    CONFIG,
    CONFIG_HASH_KEY,
    EVAL_RESULTS,
    FORMAT,
    GRAPH_FILES,
    HASHED_FILES,
    HISTORY,
    SELF_CONSISTENT,
    SEQUENCE_FILE,
    STEP_FILE,
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


SOURCES = ("zoo", "export", "model_cards", "pyproject.toml")  # what a checkpoint's code and card come from
SOURCE_TREE = Path(__file__).parents[2]  # the checkout: zoo/storage/checkpoint.py → its root


def git_commit(root: Path | None = None) -> str:
    """HEAD of the source tree this code runs from. Where the sources (SOURCES: tracked changes and untracked,
    not ignored files, e.g. a new family file not yet committed) differ from it, "<sha>-dirty-<12 hex>": the hex
    is a SHA-256 of those differences (the diff and the untracked files' bytes), so a checkpoint built from
    uncommitted code says so and which code it was (`commit_with_sources` finds the commit that holds it). A copy
    of the tree without its .git folder (a GPU machine's) is "unknown" unless ICL_ZOO_COMMIT names the commit it
    was copied from (scripts/gpu_paper_length_runs.sh sets it)."""
    root = root or SOURCE_TREE
    fallback = os.environ.get("ICL_ZOO_COMMIT") or "unknown"
    try:
        head = _git(root, "rev-parse", "HEAD")
        if head.returncode != 0:
            return fallback
        sha = head.stdout.decode().strip()
        status = _git(root, "status", "--porcelain", "--untracked-files=all", "-z", "--", *SOURCES)
        if status.returncode != 0 or not status.stdout.strip(b"\0"):
            return sha
        digest = hashlib.sha256(_sources_diff(root, "HEAD").stdout)
        for record in sorted(status.stdout.split(b"\0")):
            if record.startswith(b"?? "):  # an untracked file: its path and bytes
                path = root / record[3:].decode(errors="surrogateescape")
                digest.update(record + (path.read_bytes() if path.is_file() and not path.is_symlink() else b""))
        return f"{sha}-dirty-{digest.hexdigest()[:12]}"
    except (OSError, subprocess.SubprocessError):
        return fallback


DIRTY = re.compile(r"([0-9a-f]{40})-dirty-([0-9a-f]{12})")
MAX_DESCENDANTS = 2000  # commits after a dirty build's HEAD searched for its sources (each one `git diff`, ~10 ms)
SEARCH_SECONDS = 20.0  # and at most this long in all


@functools.lru_cache(maxsize=64)
def commit_with_sources(recorded: str, root: Path | None = None) -> str | None:
    """The first commit after a "<sha>-dirty-<12 hex>" build's HEAD whose sources (SOURCES) are the ones the build
    ran: `git diff <sha> <commit> -- SOURCES` hashes to the recorded hex, as `git_commit` hashed the working tree's
    diff. So a checkpoint built from uncommitted code names a commit it can be rebuilt from, checked by its hash.
    None for anything else: a clean or unknown commit, a value that is not such a string (it comes from a
    downloaded config.json), a build whose uncommitted sources included untracked files (hashed apart from the
    diff), a HEAD this repository lacks, a tree that is not the sources' own checkout (an installed wheel), or no
    match among the first MAX_DESCENDANTS descendants within SEARCH_SECONDS. Cached per process."""
    match = DIRTY.fullmatch(recorded) if isinstance(recorded, str) else None
    if not match:
        return None
    sha, hexdigest = match.groups()
    root = root or SOURCE_TREE
    deadline = time.monotonic() + SEARCH_SECONDS
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != Path(root).resolve():
            return None  # not a checkout of these sources (a wheel installed inside some other repository)
        later = _git(root, "rev-list", "--reverse", "--ancestry-path", f"{sha}..HEAD")
        if later.returncode != 0:
            return None
        for commit in later.stdout.decode().split()[:MAX_DESCENDANTS]:
            if time.monotonic() > deadline:
                return None
            diff = _sources_diff(root, sha, commit)
            if diff.returncode == 0 and hashlib.sha256(diff.stdout).hexdigest()[:12] == hexdigest:
                return commit
    except (OSError, subprocess.SubprocessError):
        return None
    return None


def _sources_diff(root: Path, *revisions: str) -> subprocess.CompletedProcess:
    """`git diff <revisions> --binary -- SOURCES` in git's default output, whatever the user's git configuration:
    prefixes, colour, external drivers, text conversion, renames and the abbreviation of blob ids (7 hex digits,
    git's default below 16,384 objects) are pinned, so one tree hashes the same on every machine and as the repository
    grows. (Git still lengthens an id whose 7 digits are ambiguous among its objects.)"""
    pinned = ("-c", "core.abbrev=7", "-c", "diff.mnemonicPrefix=false", "-c", "diff.noprefix=false",
              "-c", "diff.renames=true", "-c", "diff.relative=false", "-c", "core.quotePath=true")
    return _git(root, *pinned, "diff", *revisions, "--binary", "--no-ext-diff", "--no-color", "--no-textconv",
                "--src-prefix=a/", "--dst-prefix=b/", "--diff-algorithm=myers", "-U3", "--", *SOURCES)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=10)


_PINNED_COMMIT: str | None = None  # pin_source_commit's reading, for every checkpoint this process saves


def pin_source_commit() -> str:
    """Read the source tree's commit (`git_commit`) once, at the first call, and record it in every checkpoint this
    process saves from then on. A process runs the code it imported when it started; a long run outlives commits
    made meanwhile, and the tree at save time would name code that did not run. Training commands call it as they
    start, and the training loop (zoo/running/train.py `fit`) before its first step, in whatever process it runs."""
    global _PINNED_COMMIT
    if _PINNED_COMMIT is None:
        _PINNED_COMMIT = git_commit()
    return _PINNED_COMMIT


# The card huggingface_hub's `save_pretrained` writes (ModelHubMixin.generate_model_card): this layer renders
# none of its own; the full card comes with `zoo build`, `zoo export` and `zoo publish`.
SHORT_CARD = """---
{{ card_data }}
---

An [icl-zoo]({{ repo_url }}) checkpoint saved with `save_pretrained`: weights, config.json and eval_results.json.

**Left out: {{ left_out }}** (ONNX graphs, which the saving layer cannot write). Without them the checkpoint loads
in PyTorch but cannot stream or run in ONNX Runtime. `zoo export FOLDER` adds them and the full model card;
`zoo publish FOLDER --repo ORG/NAME` then publishes the complete repo.
Load it with `zoo.load(folder)`, `zoo.from_pretrained(folder)` or `Checkpoint.from_pretrained(folder)`.
"""


def open_checkpoint(path_or_repo, *, revision: str | None = None, endpoint: str | None = None,
                    map_location: str | torch.device = "cpu", **download) -> Checkpoint:
    """The one loading path (`zoo.load`, `zoo.from_pretrained`, `Checkpoint.from_pretrained`): a local folder, a
    Hub repo id `ORG/NAME` or a bare registry entry name, located by zoo.storage.locate (the id validated, only the
    checkpoint's own files downloaded, a released entry checked against the shipped release index) and built from
    the bytes that were hashed. `download`: cache_dir, token, force_download, local_files_only."""
    return build_checkpoint(locate(path_or_repo, revision=revision, endpoint=endpoint, names=default_registry().entries,
                                   unknown=unknown_entry_error, **download), map_location)


def state_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of a module's weights (safetensors bytes without metadata): whether they changed since loading."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    return hashlib.sha256(safetensors_save(state)).hexdigest()


def _module_checkpoint(model: torch.nn.Module, record: dict) -> Checkpoint:
    """The checkpoint a module `zoo.from_pretrained` returned saves through: its loaded checkpoint (`record`, see
    `Checkpoint.pretrained_module`) with the module's current weights. Weights changed since loading (fine-tuned)
    no longer have the loaded metrics: those are dropped, not copied."""
    entry = record["entry"]
    fields = {"metrics": record["metrics"], "history": record["history"], "provenance": record["provenance"]}
    if state_sha256(model) != record["weights_sha256"]:
        warnings.warn(f"the weights of {entry.name} changed since they were loaded: saving them without the loaded "
                      "metrics and training history (`zoo eval FOLDER` measures the new weights)", UserWarning, stacklevel=3)
        fields = {"metrics": {}, "history": [], "provenance": {**record["provenance"], "changed_after_loading": {
            "from_weights_sha256": record["weights_sha256"]}}}
    return Checkpoint(model=model, entry=entry, task_spec=TASK_ADAPTER.validate_python(record["task"]),
                      construction=record["construction"], **fields)


def _module_save_pretrained(model, record, save_directory, **kwargs):
    """`model.save_pretrained(folder)` of a module `zoo.from_pretrained` returned (see `Checkpoint.pretrained_module`)."""
    return _module_checkpoint(model, record).save_pretrained(save_directory, **kwargs)


def _module_push_to_hub(model, record, repo_id, **kwargs):
    """`model.push_to_hub(repo_id)` of a module `zoo.from_pretrained` returned (see `Checkpoint.pretrained_module`)."""
    return _module_checkpoint(model, record).push_to_hub(repo_id, **kwargs)


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

    def pretrained_module(self) -> torch.nn.Module:
        """The model, in eval mode, as `zoo.from_pretrained` returns it: a plain `torch.nn.Module` that also saves
        itself back through this checkpoint, `model.save_pretrained(folder)` (then `zoo.from_pretrained(folder)`
        gives the same outputs) and `model.push_to_hub(repo_id)`. They are functools.partial of module-level
        functions over a plain record of this checkpoint (the task as its JSON), so the module still pickles
        (`torch.save(model)`) and deep-copies. Weights changed since loading are saved without the loaded metrics."""
        model = self.model.eval()
        record = {"entry": self.entry, "task": self.task_spec.model_dump(mode="json"), "provenance": self.provenance,
                  "construction": self.construction, "metrics": self.metrics, "history": self.history,
                  "weights_sha256": state_sha256(model)}
        model.save_pretrained = functools.partial(_module_save_pretrained, model, record)
        model.push_to_hub = functools.partial(_module_push_to_hub, model, record)
        return model

    # ------------------------------------------------------------- save
    def graphs_left_out(self) -> list[str]:
        """The ONNX graphs a complete checkpoint of this model has and `save_pretrained` does not write:
        model.onnx, and model_step.onnx + model_chunk.onnx when the model is recurrent."""
        return [SEQUENCE_FILE, *((STEP_FILE, CHUNK_FILE) if getattr(self.model, "recurrent", False) else ())]

    def generate_model_card(self, *args, **kwargs):
        """huggingface_hub's short card (SHORT_CARD), naming the graphs this save leaves out."""
        kwargs.setdefault("left_out", ", ".join(self.graphs_left_out()))
        return super().generate_model_card(*args, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        """`save_pretrained` (huggingface_hub): the folder without ONNX graphs, which this floor cannot write (the
        exporter is above it): a warning names them and `zoo export FOLDER`, and huggingface_hub then writes the
        short card, which says the same, where the folder has none. A generated zoo card left from an earlier
        save describes other files (graphs this save removes), so it goes; a hand-written README.md stays. The
        full Hub repo folder, graphs and card included, is `zoo.running.builder.save(ckpt, folder)` (`zoo export`)."""
        self.save_files(save_directory)
        card = Path(save_directory) / CARD
        if card.is_file() and not card.is_symlink() and CARD_MARKER in card.read_text(errors="replace"):
            card.unlink()
        warnings.warn(f"save_pretrained wrote {save_directory} without {', '.join(self.graphs_left_out())} (ONNX graphs: "
                      f"the checkpoint loads in PyTorch but cannot stream); `zoo export {save_directory}` adds them",
                      UserWarning, stacklevel=3)

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

    def push_to_hub(self, repo_id: str, *, endpoint: str | None = None, token: str | None = None,
                    private: bool | None = None, commit_message: str | None = None, branch: str | None = None,
                    create_pr: bool | None = None, config=None, model_card_kwargs: dict | None = None, **_kwargs):
        """ModelHubMixin's `push_to_hub`, to any Hub endpoint (`endpoint`, default HF_ENDPOINT or huggingface.co):
        `HfApi(endpoint).create_repo(exist_ok=True)`, then `upload_folder` of a `save_pretrained` folder. That folder
        has no ONNX graphs (a warning and its card name them): for the complete repo, `zoo export FOLDER` then
        `zoo publish FOLDER --repo ORG/NAME --hub URL`. The local hub (`zoo hub serve`) is read-only over HTTP:
        `zoo publish FOLDER --repo ORG/NAME` writes it. Returns upload_folder's CommitInfo."""
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        validate_repo_id(repo_id)
        local = (f"the local hub takes no uploads over HTTP: save the checkpoint (`zoo export FOLDER` adds the graphs) "
                 f"and `zoo publish FOLDER --repo {repo_id}` writes it into the local hub")
        if endpoint == "local":
            raise HubError(local)
        api = HfApi(endpoint=endpoint, token=token)
        try:
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        except HfHubHTTPError as e:
            if e.response is not None and e.response.status_code == 405:  # `zoo hub serve`: GET/HEAD only
                raise HubError(f"{endpoint or api.endpoint} is read-only; {local}") from None
            raise
        left_out = ", ".join(self.graphs_left_out())
        with tempfile.TemporaryDirectory(prefix="icl-zoo-push-") as tmp:
            folder = Path(tmp) / repo_id.split("/")[1]
            self.save_pretrained(folder, model_card_kwargs=model_card_kwargs)
            return api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder, revision=branch,
                                     create_pr=create_pr,
                                     commit_message=commit_message or f"Push {self.entry.name} with icl-zoo "
                                                                      f"save_pretrained (without {left_out})")

    # ------------------------------------------------------------- load
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, revision: str | None = None, endpoint: str | None = None,
                        cache_dir=None, token=None, force_download: bool = False, local_files_only: bool = False,
                        map_location: str | torch.device = "cpu", **model_kwargs) -> Checkpoint:
        """A folder, a Hub repo id `ORG/NAME` or a bare entry name, resolved as `zoo.load` resolves it
        (`open_checkpoint`). Overrides ModelHubMixin's, which would download and parse config.json itself (no
        size or depth cap, every repo file fetchable) before this class could check it. `endpoint`: the Hub
        (default HF_ENDPOINT); `revision`, `cache_dir`, `token`, `force_download`, `local_files_only` as for
        any Hub library. Nothing in config.json overrides the checkpoint, so no other keyword is taken."""
        if model_kwargs:
            raise TypeError(f"Checkpoint.from_pretrained() got unexpected keyword arguments {sorted(model_kwargs)}")
        return cls._from_pretrained(model_id=str(pretrained_model_name_or_path), revision=revision, endpoint=endpoint,
                                    cache_dir=cache_dir, token=token, force_download=force_download,
                                    local_files_only=local_files_only, map_location=map_location)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision=None, cache_dir=None, force_download=False,
                         local_files_only=False, token=None, endpoint=None, map_location="cpu",
                         **_config_fields) -> Checkpoint:
        """huggingface_hub's hook, kept for callers of the mixin's protocol: `open_checkpoint`."""
        return open_checkpoint(model_id, revision=revision, endpoint=endpoint, map_location=map_location,
                               cache_dir=cache_dir, token=token, force_download=force_download,
                               local_files_only=local_files_only)


def read_checkpoint(folder: Path | VerifiedFolder, map_location: str | torch.device = "cpu") -> Checkpoint:
    """The checkpoint of a folder (checked against its own config.json here), or of the files `zoo.storage.locate`
    already read and checked."""
    verified = folder if isinstance(folder, VerifiedFolder) else verify_files(Path(folder))
    return build_checkpoint(verified, map_location)


def build_checkpoint(verified: VerifiedFolder, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Build the checkpoint from files already read and hash-checked: the model from those same bytes."""
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
        "git_commit": _PINNED_COMMIT or git_commit(),
        "torch_version": torch.__version__,
        "seed": seed,
        "steps": steps,
        "device": device,
        "device_name": device_name(device),
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "dataset_hashes": dataset_hashes,
    }


def device_name(device: str) -> str:
    """What ran it, in words: the GPU's name (e.g. "NVIDIA H200") for a CUDA device, else the CPU's model."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
