"""Building the release: each registry entry built (trained at the run length its time budget affords, or
constructed) in `.work/<entry>`, its shipped files swapped into `release/<entry>` whole, its index row
written; `zoo release refresh` re-renders the cards, figures (and graphs) of released entries in place."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import torch

from export import onnx_export
from zoo.publishing.release.index import index_row, is_adoptable, is_current, write_index
from zoo.publishing.release.plan import entry_fingerprint, run_length, training_mode
from zoo.running import builder
from zoo.running.executor import Backend, Job, run_jobs
from zoo.running.train import default_device, flush_denormals_in_this_process
from zoo.science.expected import measurements
from zoo.science.registry import Entry, default_registry, get_entry, get_task_spec, unknown_entry_error
from zoo.storage import atomic
from zoo.storage.card import write_card_and_figures
from zoo.storage.checkpoint import read_checkpoint
from zoo.storage.locate import VERSION, ReleaseError, read_index, release_dir, verify_folder
from zoo.storage.manifest import GRAPH_FILES, read_config_core
from zoo.storage.save import add_graphs

WORK = ".work"
SHIPPED = {".json", ".safetensors", ".onnx", ".md", ".png"}  # what a released folder may hold


# ---------------------------------------------------------------- one entry
def build_entry(name: str, root: Path, *, time_budget: float | None, device: str | None, threads: int | None,
                force: bool = False, progress: bool = False, compiled: bool = True) -> dict:
    """Build entry `name` into `root/<name>` in this process and return its index row."""
    made = make_entry(name, root / WORK, time_budget=time_budget, device=device, threads=threads, force=force,
                      progress=progress, compiled=compiled)
    return ship_entry(root, name, made)


def make_entry_announced(name: str, work_root: str | Path, **kwargs) -> dict:
    """`make_entry`, saying when it starts (where, and how long its run is): a pool's or a cluster's lines come
    one per entry as they start and as they finish."""
    started = time.strftime("%H:%M:%S")
    entry = get_entry(name)
    length = f"{entry.source.steps:,} recipe steps" if entry.source.kind == "trained" else "constructed"
    print(f"  started {name} ({length}; {socket.gethostname()} pid {os.getpid()}, {started})", flush=True)
    return make_entry(name, work_root, **kwargs)


def make_entry(name: str, work_root: str | Path, *, time_budget: float | None, device: str | None,
               threads: int | None, force: bool = False, progress: bool = False, compiled: bool = True) -> dict:
    """The job of one entry, wherever it runs (this process, a worker process, a Ray task on another machine):
    build it in `work_root/<name>` (resumable there) and return what the release needs of it: its shipped
    files' bytes, the build's seconds and the measured steps/s. The driver ships them (`ship_entry`), so a
    worker never writes into the release folder. A trained entry that does not run as a CUDA-graph ensemble
    trains compiled (`compiled`)."""
    flush_denormals_in_this_process()  # a worker process: before its first op starts torch's threads
    if threads:
        torch.set_num_threads(threads)
    device = device or str(default_device())
    entry = get_entry(name)
    work = Path(work_root) / name
    started = time.perf_counter()
    rate = None
    if entry.source.kind == "trained":
        rate = _train_entry(entry, work, time_budget=time_budget, device=device, force=force, progress=progress,
                            compiled=compiled)
    else:
        builder.build(name, work / "ckpt", progress=progress, force=True)
    seconds = time.perf_counter() - started
    files = {path.name: path.read_bytes() for path in sorted((work / "ckpt").iterdir())
             if path.is_file() and not path.is_symlink() and path.suffix in SHIPPED}
    shutil.rmtree(work, ignore_errors=True)
    return {"files": files, "build_seconds": seconds, "steps_per_second": rate}


def ship_entry(root: Path, name: str, made: dict) -> dict:
    """The files of a made entry (`make_entry`) become root/name, whole; returns its index row, measured from the
    shipped folder (hashes included) by the driver."""
    staged = _staging(root, name)
    for filename, data in made["files"].items():
        if Path(filename).name != filename or Path(filename).suffix not in SHIPPED:
            raise ReleaseError(f"{name}: a built entry returned the file name {filename!r}, which a release does not ship")
        (staged / filename).write_bytes(data)
    _swap_in(root, name, staged)
    return index_row(name, root / name, build_seconds=made["build_seconds"], steps_per_second=made["steps_per_second"])


def _train_entry(entry: Entry, work: Path, *, time_budget: float | None, device: str, force: bool, progress: bool,
                 compiled: bool) -> float | None:
    """Train trained entry `entry` into work/ckpt for the steps `time_budget` affords (`run_length`), resuming
    the run recorded in `work` unless `force`; returns the steps/s measured for the budget (None without one)."""
    name = entry.name
    # One untrained model (the seed's) decides the training mode and is the one trained; a time budget
    # times a second, throw-away one (measure_rate)
    model = builder.untrained_model(entry, entry.source.seed)
    graphed, compiled = training_mode(name, device, compiled, model=model)
    steps, rate = run_length(name, device, time_budget, compiled=compiled, graphed=graphed)
    # The run record (zoo.running.builder.claim_run_dir's schema): a resumed build continues the same run
    # length for the same definition; another definition's, a corrupt one or a forced rebuild starts afresh.
    previous = builder.read_run_record(work)
    if not force and previous and (previous.get("entry"), previous.get("definition"), previous.get("seed")) == (
            name, entry_fingerprint(name), entry.source.seed) and isinstance(previous.get("steps"), int):
        steps = previous["steps"]
    builder.claim_run_dir(work, entry, get_task_spec(entry.task), seed=entry.source.seed, steps=steps, force=True)
    # force: `work` is the release's own scratch; the marker above decided what of it is resumed, and
    # what else an interrupted build left there (another definition's checkpoint) is replaced
    if graphed:  # zoo/running/ensemble.py
        builder.build_ensemble(name, [entry.source.seed], [work / "ckpt"], run_dir=work / "ensemble", steps=steps,
                               device=device, progress=progress, force=True, first=model)
    else:
        builder.build(name, work / "ckpt", steps=steps, device=device, progress=progress, compiled=compiled,
                      force=True, model=model)
    return rate


def _staging(root: Path, name: str) -> Path:
    staged = root / f".{name}.staged"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def _staged_copy(root: Path, name: str) -> Path:
    """A staged copy of released folder root/name, to change and swap in whole (`_swap_in`)."""
    staged = _staging(root, name)
    for path in sorted((root / name).iterdir()):
        shutil.copyfile(path, staged / path.name)
    return staged


def _swap_in(root: Path, name: str, staged: Path) -> None:
    """Replace root/name by the staged folder: it appears whole; the old one is removed after, or put
    back if the staged one cannot be renamed in (zoo.storage.atomic.swap)."""
    atomic.swap(root / name, staged)


# ---------------------------------------------------------------- the release
def build_release(root: Path | None = None, *, only: list[str] | None = None, time_budget: float | None = None,
                  device: str | None = None, workers: int = 1, threads: int | None = None, force: bool = False,
                  progress: bool = True, compiled: bool = True, backend: Backend | None = None) -> dict:
    """Build every registry entry (or `only`) into `root`; skip those already released with the same
    definition (resumable), rebuild those whose entry or task changed. Returns the index. The entries run
    through the one executor (zoo.running.executor): `backend` (default: `workers` local processes, 1 = this
    process), e.g. `Backend("ray", address=...)` on a Ray cluster; this process writes each entry's folder and
    its index.json row as its result arrives."""
    backend = backend or Backend(workers=workers)
    root = Path(root or release_dir())
    root.mkdir(parents=True, exist_ok=True)
    registry = default_registry()
    names = sorted(registry.entries) if not only else only
    for name in names:
        if name not in registry.entries:
            raise unknown_entry_error(name)
    index, todo = _index_and_todo(root, names, registry, force)
    rows = index["entries"]
    if progress:
        print(f"release {VERSION}: {len(names) - len(todo)} of {len(names)} entries current, building {len(todo)} "
              f"in {backend.describe()}", flush=True)
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

    _build_entries(todo, root, kwargs, backend=backend, progress=progress, finished=finished, failed=failed)
    index["build_seconds_last_run"] = round(time.perf_counter() - started, 1)
    write_index(root, index)
    if failures:
        raise ReleaseError(f"{len(failures)} entries failed to build (the others are released; re-run to retry):\n"
                           + "\n".join(f"  {n}: {msg}" for n, msg in failures.items()))
    return index


def _index_and_todo(root: Path, names: list[str], registry, force: bool) -> tuple[dict, list[str]]:
    """The index of `root` brought up to date before building (this release's version, rows for complete
    folders whose row was never written, entries removed from the registry dropped), and the `names` to
    build: those not current (all with `force`)."""
    index = read_index(root)
    index["version"] = VERSION
    rows = index.setdefault("entries", {})
    for name in names:  # a complete folder whose index row was never written (the build stopped in between)
        if name not in rows and not force and is_adoptable(root / name, name):
            rows[name] = index_row(name, root / name)
    todo = [n for n in names if force or not is_current(root, rows.get(n))]
    for name in set(rows) - set(registry.entries):  # entries removed from the registry leave the release
        rows.pop(name)
        shutil.rmtree(root / name, ignore_errors=True)
    return index, todo


def _build_entries(todo: list[str], root: Path, kwargs: dict, *, backend: Backend, progress: bool, finished,
                   failed) -> None:
    """`make_entry` for each of `todo` through the executor; each result is shipped here and goes to
    `finished(name, row)`, each exception (the job's or the shipping's) to `failed(name, error)`, as it comes.
    In this process each entry's training shows its step bar; elsewhere each says when it starts."""
    inline = backend.in_process
    if not inline and kwargs.get("threads") is None and backend.kind == "ray":
        kwargs = {**kwargs, "threads": max(1, int(backend.cpus_per_job))}  # one task's CPUs: no oversubscription
    job = make_entry_announced if progress else make_entry
    jobs = [Job(name, job, (name, str(root / WORK)), {**kwargs, "progress": progress and inline}) for name in todo]
    for name, made in run_jobs(jobs, backend):
        try:
            if isinstance(made, BaseException):
                raise made
            row = ship_entry(root, name, made)
        except Exception as e:  # one entry's failure never stops the others
            failed(name, e)
        else:
            finished(name, row)


# ---------------------------------------------------------------- refresh
def refresh_release(root: Path | None = None, *, only: list[str] | None = None, graphs: bool = False) -> dict:
    """Re-render each released entry's card and figures from its checkpoint (weights untouched,
    hashes verified first) and regenerate its index row (fingerprint, checks and verdict included):
    for a change to the cards, the index, or an entry's expected values, notes or departures.
    Claims that eval_results.json cannot answer (the paired gap to GD) are measured here from the
    checkpoint on its frozen test split.
    With `graphs`, also re-export its ONNX graphs from the same weights (for a change to the
    export, e.g. a new graph) and record their hashes in config.json."""
    root = Path(root or release_dir())
    index = read_index(root)
    for name in only or list(index["entries"]):
        row = index["entries"].get(name)
        if row is None:
            raise ReleaseError(f"{name!r} is not released in {root}")
        verify_folder(root / name, row)
        ckpt = read_checkpoint(root / name)
        remeasured = measurements(get_entry(name), ckpt)  # e.g. the paired gap to GD on the frozen test split
        if graphs:  # in a staged copy swapped in whole: an interrupted refresh leaves the release as it was
            staged = _staged_copy(root, name)
            add_graphs(ckpt, staged, onnx_export.export_checkpoint_graphs)  # the graphs, their hashes in config.json
            write_card_and_figures(read_checkpoint(staged), staged, extra_metrics=remeasured)  # the new hashes verify
            _swap_in(root, name, staged)
        elif "expected" in read_config_core(root / name)["entry"]:
            # a config.json of an older save keeps a copy of the expected values (tolerances the card no longer
            # shows): saved again without it, the same tensors and graphs, the weights' header naming the new config
            staged = _staged_copy(root, name)
            ckpt.save_files(staged, graphs=lambda _ckpt, folder: [folder / g for g in GRAPH_FILES if (folder / g).is_file()])
            write_card_and_figures(read_checkpoint(staged), staged, extra_metrics=remeasured)
            _swap_in(root, name, staged)
        else:
            write_card_and_figures(ckpt, root / name, extra_metrics=remeasured)
        new_row = index_row(name, root / name, build_seconds=row.get("build_seconds"),
                            steps_per_second=row.get("steps_per_second"), remeasured=remeasured)
        if "sources_commit" in row and "sources_commit" not in new_row and new_row["commit"] == row.get("commit"):
            new_row["sources_commit"] = row["sources_commit"]  # git cannot answer here (no .git, a shallow clone)
        index["entries"][name] = new_row
    index["version"] = VERSION  # the release these files make up (a refresh may change them: new graphs, cards)
    write_index(root, index)
    return index

