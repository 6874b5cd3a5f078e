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
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError

from zoo import locate
from zoo.expected import check, verdict
from zoo.locate import (  # noqa: F401  (resolving and verifying a released folder needs no torch: zoo/locate.py)
    INDEX_JSON,
    INDEX_MD,
    ORG,
    VERSION,
    ReleaseError,
    read_index,
    release_dir,
    verify_folder,
)
from zoo.manifest import CONFIG, sha256_file
from zoo.registry import RegistryError, default_registry, definition_sha256, get_entry, get_task_spec, list_entries

WORK = ".work"
SHIPPED = {".json", ".safetensors", ".onnx", ".md", ".png"}  # what a released folder may hold
PROBE_STEPS = 20  # training steps timed to choose a run length under --time-budget
MIN_STEPS = 200  # a budgeted run is never shorter than this


def entry_fingerprint(name: str) -> str:
    """The registry's current `definition_sha256` of entry `name`; a release built from another is stale."""
    entry = get_entry(name)
    return definition_sha256(entry.model_dump(mode="json"), get_task_spec(entry.task).model_dump(mode="json"))


def unknown_entry_error(name: str) -> RegistryError:
    near = difflib.get_close_matches(name, list(default_registry().entries), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else " (see `zoo list`)"
    return RegistryError(f"{name!r} is not a registry entry{hint}")


# ---------------------------------------------------------------- resolve
def released_folder(name: str, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """The folder of the released checkpoint of registry entry `name` (zoo.locate.released_folder)."""
    if name not in default_registry().entries:
        raise unknown_entry_error(name)
    return locate.released_folder(name, revision=revision, endpoint=endpoint)


def resolve(path_or_repo: str | Path, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """A checkpoint folder from a local folder, a Hub repo id `ORG/NAME` or a bare registry entry name."""
    return locate.resolve(path_or_repo, revision=revision, endpoint=endpoint, names=default_registry().entries,
                          unknown=unknown_entry_error)


# ---------------------------------------------------------------- build
def measure_rate(name: str, device: str, steps: int = PROBE_STEPS, *, compiled: bool = False) -> float:
    """Training steps per second of entry `name` at its recipe's batch on `device`: a short run that
    `train` times after its warm-up steps (with `compiled`, after the compilation)."""
    import torch

    from zoo.builder import _prepare
    from zoo.models import create_model
    from zoo.train import WARMUP_STEPS, train

    entry, _, task, validation, _, _ = _prepare(name, None)
    torch.manual_seed(0)
    model = create_model(entry.arch, task)
    recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9})
    with tempfile.TemporaryDirectory() as tmp:
        result = train(model, task, recipe, run_dir=Path(tmp), steps=WARMUP_STEPS + steps, device=device,
                       progress=False, compiled=compiled)
    return result.steps_per_second


def run_length(name: str, device: str, time_budget: float | None, compiled: bool = False) -> tuple[int, float | None]:
    """(steps, measured steps/s): the recipe's steps, or fewer when they do not fit `time_budget` seconds."""
    recipe_steps = get_entry(name).source.steps
    if time_budget is None:
        return recipe_steps, None
    rate = measure_rate(name, device, compiled=compiled)
    affordable = max(MIN_STEPS, int(time_budget * rate) // 100 * 100)
    return min(recipe_steps, affordable), rate


def training_mode(name: str, device: str, compiled: bool = True) -> tuple[bool, bool]:
    """(graphed, compiled): how the release build trains entry `name` on `device`. Vmappable models on
    a GPU replay each step as one CUDA graph (zoo/ensemble.py), unless their recipe skips overflowing
    steps (`max_skipped_steps`: each step is checked); the others go through torch.compile
    (with `compiled`) where their model says it pays and a compiler is there to build it."""
    from zoo.models import create_model
    from zoo.train import can_compile, on_cuda

    entry = get_entry(name)
    model = create_model(entry.arch, get_task_spec(entry.task).build())
    skips = getattr(entry.source, "max_skipped_steps", 0)  # skipping steps trains one model at a time, not a graph
    graphed = on_cuda(device) and model.vmappable and not skips
    return graphed, compiled and not graphed and model.compile_pays and can_compile(device)


def build_entry(name: str, root: Path, *, time_budget: float | None, device: str | None, threads: int | None,
                force: bool = False, progress: bool = False, compiled: bool = True) -> dict:
    """Build entry `name` into `root/<name>` and return its index row (also run in worker processes).
    A trained entry that does not run as a CUDA-graph ensemble trains compiled (`compiled`)."""
    import torch

    from zoo.builder import build, build_ensemble
    from zoo.train import default_device, flush_denormals_in_this_process

    flush_denormals_in_this_process()  # a worker process: before its first op starts torch's threads
    if threads:
        torch.set_num_threads(threads)
    device = device or str(default_device())
    entry = get_entry(name)
    work = root / WORK / name
    started = time.perf_counter()
    steps, rate = None, None
    if entry.source.kind == "trained":
        graphed, compiled = training_mode(name, device, compiled)
        steps, rate = run_length(name, device, time_budget, compiled=compiled)
        marker = work / "run.json"  # a resumed build continues the same run length, for the same definition
        previous = json.loads(marker.read_text()) if marker.is_file() else None
        if previous is not None and (force or previous.get("fingerprint") != entry_fingerprint(name)):
            shutil.rmtree(work)  # a forced rebuild, or the recipe changed: the old state is not this run's
        elif previous is not None:
            steps = previous["steps"]
        work.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"steps": steps, "fingerprint": entry_fingerprint(name)}))
        if graphed:  # zoo/ensemble.py
            build_ensemble(name, [entry.source.seed], [work / "ckpt"], run_dir=work / "ensemble", steps=steps,
                           device=device, progress=progress)
        else:
            build(name, work / "ckpt", steps=steps, device=device, progress=progress, compiled=compiled)
    else:
        build(name, work / "ckpt", progress=progress)
    seconds = time.perf_counter() - started

    staged = _staging(root, name)
    for path in sorted((work / "ckpt").iterdir()):
        if path.is_file() and not path.is_symlink() and path.suffix in SHIPPED:
            shutil.copyfile(path, staged / path.name)
    _swap_in(root, name, staged)
    shutil.rmtree(work, ignore_errors=True)
    return index_row(name, root / name, build_seconds=seconds, steps_per_second=rate)


def _staging(root: Path, name: str) -> Path:
    staged = root / f".{name}.staged"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def _swap_in(root: Path, name: str, staged: Path) -> None:
    """Replace root/name by the staged folder: it appears whole; the old one is removed after."""
    final, old = root / name, root / f".{name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staged, final)
    shutil.rmtree(old, ignore_errors=True)


def index_row(name: str, folder: Path, *, build_seconds: float | None = None, steps_per_second: float | None = None) -> dict:
    from zoo.models import FAMILY_OF_TYPE

    entry = get_entry(name)
    config = json.loads((folder / CONFIG).read_text())
    metrics = json.loads((folder / "eval_results.json").read_text())
    prov = config.get("provenance", {})
    checks = check(entry, metrics)
    row = {
        "entry": name,
        "arch": entry.arch.type,
        "family": FAMILY_OF_TYPE[entry.arch.type].name,  # the Family (zoo/models/) that builds that arch type
        "paper": entry.paper,
        "paper_file": Path(entry.file).stem,
        "source": entry.source.kind,
        "steps": prov.get("steps"),
        "recipe_steps": entry.source.steps if entry.source.kind == "trained" else None,
        "device": prov.get("device"),
        "threads": prov.get("threads"),
        "seed": prov.get("seed"),
        "build_seconds": round(build_seconds, 1) if build_seconds is not None else None,
        "steps_per_second": round(steps_per_second, 1) if steps_per_second else None,
        "test_loss": metrics.get("test_loss"),
        "gd_loss": metrics.get("gd_loss"),
        "gd_steps": metrics.get("gd_steps"),
        "lstsq_loss": metrics.get("lstsq_loss"),
        "checks": [c.as_dict() for c in checks],
        "verdict": verdict(checks),
        "commit": prov.get("git_commit"),
        "fingerprint": definition_sha256(config["entry"], config["task"]),  # what the weights were built from
        "files": {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()},
    }
    row["note"] = shortfall_note(row)
    return row


def run_summary(row: dict) -> str:
    """How a released entry was made, in one line (steps run vs recipe, device)."""
    if row["source"] != "trained":
        return "constructed analytically (no training)"
    short = row["steps"] < row["recipe_steps"]
    return (f"trained {row['steps']:,} of the recipe's {row['recipe_steps']:,} steps on {row['device']}"
            + (" — a shorter run than the paper's recipe" if short else " (the full recipe)"))


def shortfall_note(row: dict) -> str:
    """Why a trained entry falls short (or has no paper value) and what run would close it."""
    if row["source"] != "trained":
        return "" if row["verdict"] != "falls short" else "a construction that misses its paper value: a defect"
    short_run = row["steps"] is not None and row["recipe_steps"] and row["steps"] < row["recipe_steps"]
    gap = ""
    if row.get("gd_loss") and row.get("test_loss") is not None:
        gap = f"test loss {100 * (row['test_loss'] / row['gd_loss'] - 1):+.1f}% vs {row.get('gd_steps') or 1}-step GD"
    if short_run:
        run = (f"shorter run: {row['steps']:,} of the recipe's {row['recipe_steps']:,} steps on {row['device']}; "
               f"the recipe-length run is `zoo release build --only {row['entry']} --force` on a GPU")
        return "; ".join(x for x in (gap, run) if x)
    return gap


def build_release(root: Path | None = None, *, only: list[str] | None = None, time_budget: float | None = None,
                  device: str | None = None, workers: int = 1, threads: int | None = None, force: bool = False,
                  progress: bool = True, compiled: bool = True) -> dict:
    """Build every registry entry (or `only`) into `root`; skip those already released with the same
    definition (resumable), rebuild those whose entry or task changed. Returns the index."""
    root = Path(root or release_dir())
    root.mkdir(parents=True, exist_ok=True)
    registry = default_registry()
    names = sorted(registry.entries) if not only else only
    for name in names:
        if name not in registry.entries:
            raise unknown_entry_error(name)
    index = read_index(root)
    index["version"] = VERSION
    rows = index.setdefault("entries", {})
    for name in names:  # a complete folder whose index row was never written (the build stopped in between)
        if name not in rows and not force and _adoptable(root / name, name):
            rows[name] = index_row(name, root / name)
    todo = [n for n in names if force or not _is_current(root, rows.get(n))]
    for name in set(rows) - set(registry.entries):  # entries removed from the registry leave the release
        rows.pop(name)
        shutil.rmtree(root / name, ignore_errors=True)
    if progress:
        print(f"release {VERSION}: {len(names) - len(todo)} of {len(names)} entries current, building {len(todo)}"
              + (f" with {workers} workers" if workers > 1 else ""), flush=True)
    # Trained entries first: they are the long ones, so parallel workers end together.
    todo.sort(key=lambda n: (registry.entries[n].source.kind != "trained", n))
    started = time.perf_counter()
    kwargs = {"time_budget": time_budget, "device": device, "threads": threads, "force": force, "compiled": compiled}

    def finished(name: str, row: dict) -> None:
        rows[name] = row
        write_index(root, index)
        if progress:
            steps = f"{row['steps']:,}/{row['recipe_steps']:,} steps" if row["source"] == "trained" else "constructed"
            print(f"  [{len(rows)}/{len(registry.entries)}] {name}: {steps}, test loss {row['test_loss']:.5g}, "
                  f"{row['verdict']} ({row['build_seconds']:.0f} s; {time.perf_counter() - started:.0f} s elapsed)", flush=True)

    failures = {}

    def failed(name: str, error: BaseException) -> None:  # one entry's failure never stops the others
        failures[name] = f"{type(error).__name__}: {error}"
        print(f"  FAILED {name}: {failures[name]}", flush=True)

    if workers <= 1:  # one process: each entry's training shows its step bar
        for name in todo:
            if progress:
                print(f"  building {name}", flush=True)
            try:
                row = build_entry(name, root, **kwargs, progress=progress)
            except Exception as e:
                failed(name, e)
            else:
                finished(name, row)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(build_entry, name, root, **kwargs): name for name in todo}
            for future in as_completed(futures):
                try:
                    row = future.result()
                except Exception as e:
                    failed(futures[future], e)
                else:
                    finished(futures[future], row)
    index["build_seconds_last_run"] = round(time.perf_counter() - started, 1)
    write_index(root, index)
    if failures:
        raise ReleaseError(f"{len(failures)} entries failed to build (the others are released; re-run to retry):\n"
                           + "\n".join(f"  {n}: {msg}" for n, msg in failures.items()))
    return index


def _adoptable(folder: Path, name: str) -> bool:
    from zoo.manifest import CheckpointError, verify_files

    try:
        config = verify_files(folder)
        return definition_sha256(config["entry"], config["task"]) == entry_fingerprint(name)
    except (CheckpointError, OSError, ValidationError):  # a folder of another schema is rebuilt, not adopted
        return False


def _is_current(root: Path, row: dict | None) -> bool:
    if row is None or not (root / row["entry"] / CONFIG).is_file():
        return False
    try:
        verify_folder(root / row["entry"], row)
    except ReleaseError:
        return False
    return row.get("fingerprint") == entry_fingerprint(row["entry"])


def write_index(root: Path, index: dict) -> None:
    tmp = root / (INDEX_JSON + ".tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / INDEX_JSON)
    (root / INDEX_MD).write_text(index_markdown(index))


def _fmt(x, spec=".4g") -> str:
    return "" if x is None else format(x, spec)


def index_markdown(index: dict) -> str:
    rows = list(index["entries"].values())
    current = {r["entry"]: r["fingerprint"] == entry_fingerprint(r["entry"]) for r in rows
               if r["entry"] in default_registry().entries}
    missing = sorted(set(default_registry().entries) - {r["entry"] for r in rows})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("meets", "falls short", "no paper value")}
    short_runs = sum(1 for r in rows if r["source"] == "trained" and r["steps"] < r["recipe_steps"])
    lines = [
        f"# icl-zoo release {index['version']}",
        "",
        "Generated by `zoo release build` from the registry (`zoo/entries/*.toml`); do not edit by hand.",
        "Every folder beside this file is one entry's Hub repo: `zoo.load(\"<entry>\")` loads it offline,",
        "`zoo hub serve` serves it as `icl-zoo/<entry>` at tag `" + index["version"] + "`.",
        "",
        f"{len(rows)} entries released ({len(missing)} registry entries missing); verdicts against the papers' values: "
        f"{counts['meets']} meet, {counts['falls short']} fall short, {counts['no paper value']} have no paper value. "
        f"{short_runs} trained entries hold a **shorter run than their recipe** (steps column): their numbers are "
        "those of the shorter run, not the paper's recipe.",
        "",
        "A commit marked *stale* was built from an entry or task definition that has since changed: "
        "`zoo release build` rebuilds it.",
        "",
        "| entry | arch (family) | paper | source | steps run / recipe | device | test loss | GD ref (k steps) | paper value (tolerance) → measured | verdict | note | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["paper_file"], r["entry"])):
        steps = f"{r['steps']:,} / {r['recipe_steps']:,}" if r["source"] == "trained" else "—"
        device = r["device"] + (f" ({r['threads']} thr)" if r.get("threads") else "")
        checks = "<br>".join(
            f"{c['metric']} {c['paper']:.4g} ({c['tolerance']}) → {_fmt(c['measured'])} ({c['off_by']})" for c in r["checks"]
        ) or "—"
        commit = r["commit"] or "unknown"
        commit = commit[:10] + ("-dirty" if commit.endswith("-dirty") else "") + ("" if current.get(r["entry"], True) else " *stale*")
        gd = f"{_fmt(r['gd_loss'])} ({r['gd_steps']})" if r.get("gd_loss") is not None else "—"
        lines.append(f"| [{r['entry']}]({r['entry']}/README.md) | `{r.get('arch', r['family'])}` ({r['family']}) | {r['paper']} | {r['source']} | {steps} | "
                     f"{device} | {_fmt(r['test_loss'])} | {gd} | {checks} | **{r['verdict']}** | {r['note']} | `{commit}` |")
    if missing:
        lines += ["", "Not yet released: " + ", ".join(f"`{m}`" for m in missing)]
    lines += ["", "File hashes (SHA-256) of every released file are in [`index.json`](index.json); loading verifies them.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- archive
def write_archive(root: Path, path: Path) -> Path:
    """One .tar.gz of the release (index + every entry folder), unpacked by `zoo release unpack`."""
    root, path = Path(root), Path(path)
    with tarfile.open(path, "w:gz") as tar:
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root)
            if rel.parts[0].startswith(".") or not p.is_file() or p.is_symlink():
                continue
            tar.add(p, arcname=str(Path("release") / rel), recursive=False)
    return path


def unpack_archive(path: Path, dest: Path) -> Path:
    """Unpack a release archive into `dest` (a `release/` folder): regular files only, no path escapes."""
    dest = Path(dest)
    with tarfile.open(path, "r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            parts = Path(m.name).parts
            if not m.isfile() or not parts or parts[0] != "release" or ".." in parts or Path(m.name).is_absolute():
                raise ReleaseError(f"{path}: refusing archive member {m.name!r} (only regular files under release/)")
        with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.exists() else None) as tmp:
            tar.extractall(tmp, members=members, filter="data")
            unpacked = Path(tmp) / "release"
            index = read_index(unpacked)
            for name, row in index["entries"].items():
                verify_folder(unpacked / name, row)
            covered = {INDEX_JSON, INDEX_MD, *index["entries"]}
            strays = sorted(p.name for p in unpacked.iterdir() if p.name not in covered)
            if strays:  # nothing the index does not vouch for is installed
                raise ReleaseError(f"{path}: members not covered by its index: {', '.join(strays)}")
            for p in sorted(unpacked.iterdir()):
                target = dest / p.name
                if target.is_dir():
                    shutil.rmtree(target)
                dest.mkdir(parents=True, exist_ok=True)
                shutil.move(str(p), str(target))
    return dest


# ---------------------------------------------------------------- hub
def import_to_hub(hub_root: Path, root: Path | None = None, *, only: list[str] | None = None, datasets: bool = True,
                  progress: bool = True) -> dict:
    """Publish every released folder as model repo `icl-zoo/<entry>` and each task's frozen splits as
    dataset repo `icl-zoo/<task>` on the local hub at `hub_root`, each tagged with the release version."""
    from zoo.hub import dataset_folder, publish_local, tag_local

    root = Path(root or release_dir())
    index = read_index(root)
    version = index["version"]
    revisions = {"models": {}, "datasets": {}}
    entries = {n: r for n, r in sorted(index["entries"].items()) if only is None or n in only}
    for name, row in entries.items():
        verify_folder(root / name, row)
        sha = publish_local(root / name, f"{ORG}/{name}", root=hub_root, message=f"icl-zoo release {version}")
        tag_local(hub_root, f"{ORG}/{name}", version)
        revisions["models"][name] = sha
    if datasets:
        for task in sorted({get_entry(n).task for n in entries}):
            with tempfile.TemporaryDirectory() as tmp:
                folder, _ = dataset_folder(task, Path(tmp) / task)
                sha = publish_local(folder, f"{ORG}/{task}", repo_type="dataset", root=hub_root,
                                    message=f"icl-zoo release {version}")
            tag_local(hub_root, f"{ORG}/{task}", version, repo_type="dataset")
            revisions["datasets"][task] = sha
    if progress:
        print(f"imported release {version}: {len(revisions['models'])} model repos, "
              f"{len(revisions['datasets'])} dataset repos into {hub_root}", flush=True)
    return revisions


def publish_release(org: str, *, hub: str = "hf", root: Path | None = None, token: str | None = None,
                    datasets: bool = True, progress: bool = True) -> dict:
    """Push every released folder (and each task's frozen splits) to a real Hub as `<org>/<name>`,
    tag each with the release version and list them in a Hub Collection."""
    from huggingface_hub import HfApi

    from zoo.hub import dataset_folder, publish_hub, validate_repo_id

    root = Path(root or release_dir())
    index = read_index(root)
    version = index["version"]
    endpoint = None if hub in ("hf", "huggingface") else hub
    api = HfApi(endpoint=endpoint, token=token)
    pushed = []

    def tag(repo: str, kind: str) -> None:  # the version tag points at what was just pushed, moved if it existed
        from huggingface_hub.utils import HfHubHTTPError

        try:
            api.create_tag(repo, tag=version, repo_type=kind)
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 409:
                raise
            api.delete_tag(repo, tag=version, repo_type=kind)
            api.create_tag(repo, tag=version, repo_type=kind)

    for name, row in sorted(index["entries"].items()):
        repo = validate_repo_id(f"{org}/{name}")
        verify_folder(root / name, row)
        publish_hub(root / name, repo, endpoint=endpoint, token=token, message=f"icl-zoo release {version}")
        tag(repo, "model")
        pushed.append((repo, "model"))
        if progress:
            print(f"  pushed {repo}@{version}", flush=True)
    if datasets:
        for task in sorted({get_entry(n).task for n in index["entries"]}):
            repo = validate_repo_id(f"{org}/{task}")
            with tempfile.TemporaryDirectory() as tmp:
                folder, _ = dataset_folder(task, Path(tmp) / task)
                publish_hub(folder, repo, repo_type="dataset", endpoint=endpoint, token=token,
                            message=f"icl-zoo release {version}")
            tag(repo, "dataset")
            pushed.append((repo, "dataset"))
    collection = api.create_collection(
        title=f"icl-zoo {version}", namespace=org, exists_ok=True,
        description="In-context learning by gradient descent: every icl-zoo entry's checkpoint and frozen datasets.",
    )
    for repo, kind in pushed:
        api.add_collection_item(collection.slug, item_id=repo, item_type=kind, exists_ok=True)
    return {"version": version, "collection": collection.slug, "repos": [r for r, _ in pushed]}


# ---------------------------------------------------------------- refresh / plan
def refresh_release(root: Path | None = None, *, only: list[str] | None = None, graphs: bool = False) -> dict:
    """Re-render each released entry's card and figures from its checkpoint (weights untouched,
    hashes verified first) and regenerate its index row: for a change to the cards or the index.
    With `graphs`, also re-export its ONNX graphs from the same weights (for a change to the
    export, e.g. a new graph) and record their hashes in config.json."""
    from zoo.card import write_card_and_figures
    from zoo.checkpoint import read_checkpoint

    root = Path(root or release_dir())
    index = read_index(root)
    for name in only or list(index["entries"]):
        row = index["entries"].get(name)
        if row is None:
            raise ReleaseError(f"{name!r} is not released in {root}")
        verify_folder(root / name, row)
        ckpt = read_checkpoint(root / name)
        if graphs:  # in a staged copy swapped in whole: an interrupted refresh leaves the release as it was
            from icl_zoo_export import write_graphs

            staged = _staging(root, name)
            for path in sorted((root / name).iterdir()):
                shutil.copyfile(path, staged / path.name)
            write_graphs(ckpt, staged)  # the graphs, and their hashes in config.json
            write_card_and_figures(read_checkpoint(staged), staged)  # the new hashes verify; weights match the config
            _swap_in(root, name, staged)
        else:
            write_card_and_figures(ckpt, root / name)
        index["entries"][name] = index_row(name, root / name, build_seconds=row.get("build_seconds"),
                                           steps_per_second=row.get("steps_per_second"))
    index["version"] = VERSION  # the release these files make up (a refresh may change them: new graphs, cards)
    write_index(root, index)
    return index


def print_plan(*, device: str | None = None, only: list[str] | None = None, threads: int | None = None,
               compiled: bool = True) -> list[dict]:
    """Measure each trained entry's steps/s here, eager and (with `compiled`) as `zoo release build`
    trains it (compiled unless its model says compiling does not pay), and print its recipe-length
    cost each way and the whole zoo's total: what the release build can afford. (On a GPU the entries
    the build replays as CUDA graphs are timed eagerly here: their cost is an upper bound.)"""
    import torch

    from zoo.train import can_compile, default_device

    if threads:
        torch.set_num_threads(threads)
    device = device or str(default_device())
    if compiled and not can_compile(device):
        print("no C++ compiler on the PATH ($CXX, g++, c++, clang++): torch.compile cannot build the step here, "
              "so the release build trains eagerly; measuring eager only")
        compiled = False
    names = only or [e.name for e in list_entries(source="trained")]
    rows, totals = [], {"eager": 0.0, "compiled": 0.0}
    print(f"({device}, {torch.get_num_threads()} threads; recipe-length cost in hours)")
    print(f"{'entry':34} {'recipe steps':>12} {'eager steps/s':>14} {'eager h':>8}"
          + (f" {'compiled steps/s':>17} {'compiled h':>11} {'×':>6}" if compiled else ""))
    for name in names:
        steps = get_entry(name).source.steps
        row = {"entry": name, "recipe_steps": steps, "eager_steps_per_second": measure_rate(name, device)}
        row["eager_seconds"] = steps / row["eager_steps_per_second"]
        totals["eager"] += row["eager_seconds"]
        line = f"{name:34} {steps:>12,} {row['eager_steps_per_second']:>14.1f} {row['eager_seconds'] / 3600:>8.2f}"
        if compiled:
            row["compiled_steps_per_second"] = (measure_rate(name, device, compiled=True) if training_mode(name, device)[1]
                                                else row["eager_steps_per_second"])  # the build does not compile it
            row["compiled_seconds"] = steps / row["compiled_steps_per_second"]
            totals["compiled"] += row["compiled_seconds"]
            line += (f" {row['compiled_steps_per_second']:>17.1f} {row['compiled_seconds'] / 3600:>11.2f}"
                     f" {row['compiled_steps_per_second'] / row['eager_steps_per_second']:>6.2f}")
        rows.append(row)
        print(line, flush=True)
    summary = f"{'whole zoo (trained entries, one after another)':61} {totals['eager'] / 3600:>8.2f}"
    if compiled:
        summary += f" {'':>17} {totals['compiled'] / 3600:>11.2f} {totals['eager'] / totals['compiled']:>6.2f}"
    print(summary)
    return rows
