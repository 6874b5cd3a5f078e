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

import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError

from zoo.science.expected import PAIRED_KEYS, VERDICTS, check, measurements, needs_paired, verdict
from zoo.science.registry import (
    default_registry,
    definition_sha256,
    get_entry,
    get_task_spec,
    list_entries,
    unknown_entry_error,
)
from zoo.storage import atomic, locate
from zoo.storage.locate import (
    INDEX_JSON,
    INDEX_MD,
    ORG,
    VERSION,
    ReleaseError,
    read_index,
    release_dir,
    verify_folder,
)
from zoo.storage.manifest import CONFIG, sha256_file

WORK = ".work"
SHIPPED = {".json", ".safetensors", ".onnx", ".md", ".png"}  # what a released folder may hold
PROBE_STEPS = 20  # training steps timed to choose a run length under --time-budget
MIN_STEPS = 200  # a budgeted run is never shorter than this


def entry_fingerprint(name: str) -> str:
    """The registry's current `definition_sha256` of entry `name`; a release built from another is stale."""
    entry = get_entry(name)
    return definition_sha256(entry.model_dump(mode="json"), get_task_spec(entry.task).model_dump(mode="json"))


# ---------------------------------------------------------------- resolve
def released_folder(name: str, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """The folder of the released checkpoint of registry entry `name` (zoo.storage.locate.released_folder)."""
    if name not in default_registry().entries:
        raise unknown_entry_error(name)
    return locate.released_folder(name, revision=revision, endpoint=endpoint)


def resolve(path_or_repo: str | Path, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """A checkpoint folder from a local folder, a Hub repo id `ORG/NAME` or a bare registry entry name."""
    return locate.resolve(path_or_repo, revision=revision, endpoint=endpoint, names=default_registry().entries,
                          unknown=unknown_entry_error)


# ---------------------------------------------------------------- build
def measure_rate(name: str, device: str, steps: int = PROBE_STEPS, *, compiled: bool = False,
                 graphed: bool | None = None) -> float:
    """Training steps per second of entry `name` at its recipe's batch on `device`, trained the way the
    build will train it (`training_mode`: on a GPU a one-member ensemble replayed as a CUDA graph, else
    one model, compiled with `compiled`): a short run timed after its warm-up steps (compilation, the
    graph's capture). Timing the eager one-model step instead underestimated a graphed GPU build ~10x."""
    import torch

    from zoo.running.builder import _prepare
    from zoo.running.ensemble import train_ensemble
    from zoo.running.train import WARMUP_STEPS, train
    from zoo.science.models import create_model

    entry, _, task, validation, _, _ = _prepare(name, None)
    if graphed is None:  # else the caller decided the mode (`compiled` is then the decision, not a wish)
        graphed, compiled = training_mode(name, device, compiled)
    recipe = entry.source.model_copy(update={"eval_every": 10**9, "checkpoint_every": 10**9})
    with tempfile.TemporaryDirectory() as tmp:
        if graphed:
            result = train_ensemble(lambda: create_model(entry.arch, task), task, recipe, [0], run_dir=Path(tmp),
                                    steps=WARMUP_STEPS + steps, device=device, progress=False)
        else:
            torch.manual_seed(0)
            result = train(create_model(entry.arch, task), task, recipe, run_dir=Path(tmp),
                           steps=WARMUP_STEPS + steps, device=device, progress=False, compiled=compiled)
    return result.steps_per_second


def run_length(name: str, device: str, time_budget: float | None, compiled: bool = False,
               graphed: bool | None = None) -> tuple[int, float | None]:
    """(steps, measured steps/s): the recipe's steps, or fewer when they do not fit `time_budget` seconds."""
    recipe_steps = get_entry(name).source.steps
    if time_budget is None:
        return recipe_steps, None
    rate = measure_rate(name, device, compiled=compiled, graphed=graphed)
    affordable = max(MIN_STEPS, int(time_budget * rate) // 100 * 100)
    return min(recipe_steps, affordable), rate


def training_mode(name: str, device: str, compiled: bool = True, model=None) -> tuple[bool, bool]:
    """(graphed, compiled): how the release build trains entry `name` on `device`, one seed at a
    time: zoo.running.train.training_mode on its untrained `model` (built here when not given; the rule
    `zoo build` and `zoo sweep` use)."""
    from zoo.running.train import training_mode as mode_of
    from zoo.science.models import create_model

    entry = get_entry(name)
    model = model if model is not None else create_model(entry.arch, get_task_spec(entry.task).build())
    mode = mode_of(model, entry.source, device, compile=compiled)
    return mode.graphed, mode.compiled


def build_entry_announced(name: str, root: Path, **kwargs) -> dict:
    """`build_entry` in a worker of `zoo release build --workers N`, saying when it starts (its process) and
    how long its run is: the pool's lines come one per entry as they start and as they finish."""
    import os

    started = time.strftime("%H:%M:%S")
    entry = get_entry(name)
    length = f"{entry.source.steps:,} recipe steps" if entry.source.kind == "trained" else "constructed"
    print(f"  started {name} ({length}; worker pid {os.getpid()}, {started})", flush=True)
    return build_entry(name, root, **kwargs)


def build_entry(name: str, root: Path, *, time_budget: float | None, device: str | None, threads: int | None,
                force: bool = False, progress: bool = False, compiled: bool = True) -> dict:
    """Build entry `name` into `root/<name>` and return its index row (also run in worker processes).
    A trained entry that does not run as a CUDA-graph ensemble trains compiled (`compiled`)."""
    import torch

    from zoo.running.builder import build, build_ensemble, claim_run_dir, read_run_record, untrained_model
    from zoo.running.train import default_device, flush_denormals_in_this_process

    flush_denormals_in_this_process()  # a worker process: before its first op starts torch's threads
    if threads:
        torch.set_num_threads(threads)
    device = device or str(default_device())
    entry = get_entry(name)
    work = root / WORK / name
    started = time.perf_counter()
    steps, rate = None, None
    if entry.source.kind == "trained":
        # One untrained model (the seed's) decides the training mode and is the one trained; a time budget
        # times a second, throw-away one (measure_rate)
        model = untrained_model(entry, entry.source.seed)
        graphed, compiled = training_mode(name, device, compiled, model=model)
        steps, rate = run_length(name, device, time_budget, compiled=compiled, graphed=graphed)
        # The run record (zoo.running.builder.claim_run_dir's schema): a resumed build continues the same run
        # length for the same definition; another definition's, a corrupt one or a forced rebuild starts afresh.
        previous = read_run_record(work)
        if not force and previous and (previous.get("entry"), previous.get("definition"), previous.get("seed")) == (
                name, entry_fingerprint(name), entry.source.seed) and isinstance(previous.get("steps"), int):
            steps = previous["steps"]
        claim_run_dir(work, entry, get_task_spec(entry.task), seed=entry.source.seed, steps=steps, force=True)
        # force: `work` is the release's own scratch; the marker above decided what of it is resumed, and
        # what else an interrupted build left there (another definition's checkpoint) is replaced
        if graphed:  # zoo/running/ensemble.py
            build_ensemble(name, [entry.source.seed], [work / "ckpt"], run_dir=work / "ensemble", steps=steps,
                           device=device, progress=progress, force=True, first=model)
        else:
            build(name, work / "ckpt", steps=steps, device=device, progress=progress, compiled=compiled, force=True,
                  model=model)
    else:
        build(name, work / "ckpt", progress=progress, force=True)
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
    """Replace root/name by the staged folder: it appears whole; the old one is removed after, or put
    back if the staged one cannot be renamed in (zoo.storage.atomic.swap)."""
    atomic.swap(root / name, staged)


def index_row(name: str, folder: Path, *, build_seconds: float | None = None, steps_per_second: float | None = None,
              remeasured: dict | None = None) -> dict:
    """The index row of released folder `folder`. `remeasured`: what a claim needs beyond its
    eval_results.json (zoo.science.expected.measurements: the paired gap to GD), measured from the
    checkpoint on its frozen test split here when not given."""
    from zoo.science.models import FAMILY_OF_TYPE

    entry = get_entry(name)
    config = json.loads((folder / CONFIG).read_text())
    metrics = json.loads((folder / "eval_results.json").read_text())
    prov = config.get("provenance", {})
    if remeasured is None:
        remeasured = {}
        if needs_paired(entry) and not all(k in metrics for k in PAIRED_KEYS):
            from zoo.storage.checkpoint import read_checkpoint

            remeasured = measurements(entry, read_checkpoint(folder), metrics)
    checks = check(entry, {**metrics, **remeasured})
    row = {
        "entry": name,
        "arch": entry.arch.type,
        "family": FAMILY_OF_TYPE[entry.arch.type].name,  # the Family (zoo/science/models/) that builds that arch type
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
        "remeasured": remeasured,  # measured at build/refresh time from the checkpoint, beyond eval_results.json
        "deviations": [d.what for d in entry.deviation],  # declared departures (the card has them in full)
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
        misses = row["verdict"] in ("falls short", "differs from the reference")
        return "a construction that misses its expected value: a defect" if misses else ""
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
            futures = {pool.submit(build_entry_announced if progress else build_entry, name, root, **kwargs): name
                       for name in todo}
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
    from zoo.storage.manifest import CheckpointError, verify_files

    try:
        config = verify_files(folder).config
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


def _check_cell(c: dict) -> str:
    from zoo.science.expected import claim_text, measured_text

    word = "paper" if c.get("source") == "paper" else "reference" if c.get("source") == "reference" else "stated"
    kind = c.get("kind", "within")  # a row written before claims had kinds: `zoo release refresh` rewrites it
    status = c.get("status", "meets" if c["meets"] else "falls short")
    cell = (f"{c['metric']} ({word}) {claim_text(kind, c.get('value', c.get('paper')), c['tolerance'])} → "
            f"{measured_text(kind, c['measured'])} ({c['off_by']}): {status}")
    return cell.replace("|", "\\|")  # a table cell


def index_markdown(index: dict) -> str:
    rows = list(index["entries"].values())
    current = {r["entry"]: r["fingerprint"] == entry_fingerprint(r["entry"]) for r in rows
               if r["entry"] in default_registry().entries}
    missing = sorted(set(default_registry().entries) - {r["entry"] for r in rows})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    short_runs = sum(1 for r in rows if r["source"] == "trained" and r["steps"] < r["recipe_steps"])
    departing = sum(1 for r in rows if r.get("deviations"))
    lines = [
        f"# icl-zoo release {index['version']}",
        "",
        "Generated by `zoo release build` from the registry (`zoo/science/entries/*.toml`); do not edit by hand.",
        "Every folder beside this file is one entry's Hub repo: `zoo.load(\"<entry>\")` loads it offline,",
        "`zoo hub serve` serves it as `icl-zoo/<entry>` at tag `" + index["version"] + "`.",
        "",
        (f"{len(rows)} entries released ({len(missing)} registry entries missing). Verdicts against numbers the papers "
         f"print (each quoted below the table): {counts['meets']} meet, {counts['falls short']} fall short, "
         f"{counts['meets where checkable']} meet where checkable (a claim the zoo cannot measure on that checkpoint). "
         f"Checked only against a reference the zoo computes (a closed form or a construction, not a paper verdict): "
         f"{counts['matches the reference']} match, {counts['differs from the reference']} differ. "
         f"{counts['no paper value']} have no expected value. "
         f"{short_runs} trained entries hold a **shorter run than their recipe** (steps column): their numbers are "
         f"those of the shorter run. {departing} entries declare departures from the paper's setting or recipe "
         "(departures column; each card gives what the paper says, what the zoo does and why)."),
        "",
        ("A commit marked *stale* was built from an entry's arch, recipe or task data that has since changed: "
         "`zoo release build` rebuilds it. Expected values, tolerances, notes and departures are not part of "
         "what a build is made from: `zoo release refresh` re-renders the cards and this index after a change to them."),
        "",
        ("| entry | arch (family) | paper | source | steps run / recipe | device | test loss | GD ref (k steps) "
         "| expected value (source, claim) → measured | verdict | departures | note | commit |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    quotes = []
    for r in sorted(rows, key=lambda r: (r["paper_file"], r["entry"])):
        steps = f"{r['steps']:,} / {r['recipe_steps']:,}" if r["source"] == "trained" else "—"
        device = r["device"] + (f" ({r['threads']} thr)" if r.get("threads") else "")
        checks = "<br>".join(_check_cell(c) for c in r["checks"]) or "—"
        commit = r["commit"] or "unknown"
        commit = commit[:10] + ("-dirty" if commit.endswith("-dirty") else "") + ("" if current.get(r["entry"], True) else " *stale*")
        gd = f"{_fmt(r['gd_loss'])} ({r['gd_steps']})" if r.get("gd_loss") is not None else "—"
        departures = "; ".join(r.get("deviations") or []) or "—"
        lines.append(f"| [{r['entry']}]({r['entry']}/README.md) | `{r.get('arch', r['family'])}` ({r['family']}) | {r['paper']} | {r['source']} | {steps} | "
                     f"{device} | {_fmt(r['test_loss'])} | {gd} | {checks} | **{r['verdict']}** | {departures} | {r['note']} | `{commit}` |")
        quotes += [f"- `{r['entry']}` {c['metric']}: {c['section']}: “{c['quote']}”"
                   + (f" (“{c['paper_claim']}”)" if c.get("paper_claim") else "") for c in r["checks"] if c.get("source") == "paper"]
    if quotes:
        lines += ["", "## The paper values checked", "", "Every number graded *meets* / *falls short* above, in the paper's words:", "", *quotes]
    if missing:
        lines += ["", "Not yet released: " + ", ".join(f"`{m}`" for m in missing)]
    lines += ["", "File hashes (SHA-256) of every released file are in [`index.json`](index.json); loading verifies them.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- archive
# What `zoo release unpack` accepts, checked on the tar headers before anything is extracted (the whole
# release is ~35 MB in ~550 files, its largest file ~1 MB; DESIGN.md: the archive is <= 16 MiB compressed).
ARCHIVE_ROOT = "release"  # every member is release/index.json, release/INDEX.md or release/<entry>/<file>
MAX_MEMBER_BYTES = 32 * 2**20  # uncompressed bytes one archive member may declare (its tar header's size)
MAX_ARCHIVE_BYTES = 64 * 2**20  # uncompressed bytes all members of one archive may declare together
MAX_MEMBERS = 4096  # tar members (files and directories) in one archive
# Decompressed tar bytes ever read (or seeked past) in one archive: the members' data plus, per member,
# room for its header, an extended (pax / long-name) header and padding. Bounds what a header that
# declares a huge extended record could make tarfile read, before any member is seen.
MAX_TAR_STREAM = MAX_ARCHIVE_BYTES + MAX_MEMBERS * 8 * 512
NOT_AN_ARCHIVE = "not a release archive (expected a .tar.gz written by `zoo release archive`)"
_CHUNK = 2**20


def write_archive(root: Path, path: Path) -> Path:
    """One .tar.gz of the release, unpacked by `zoo release unpack`: release/index.json, INDEX.md and
    exactly the files the index lists for each entry (checked against it first), as plain regular files
    within the caps `unpack_archive` enforces. Written to a temporary name and renamed when complete."""
    root, path = Path(root), Path(path)
    if not (root / INDEX_JSON).is_file():
        raise ReleaseError(f"{root}: no {INDEX_JSON}; nothing to archive")
    index = read_index(root)
    files = [(INDEX_JSON, root / INDEX_JSON)]
    if (root / INDEX_MD).is_file():
        files.append((INDEX_MD, root / INDEX_MD))
    for name, row in sorted(index["entries"].items()):
        verify_folder(root / name, row)  # every listed file present, regular and with its hash; nothing else
        files += [(f"{name}/{file}", root / name / file) for file in sorted(row["files"])]
    total = 0
    for arcname, p in files:
        if p.is_symlink() or not p.is_file():
            raise ReleaseError(f"{p}: not a regular file; an archive holds regular files only")
        size = p.stat().st_size
        total += size
        if size > MAX_MEMBER_BYTES or total > MAX_ARCHIVE_BYTES:
            raise ReleaseError(f"{p}: the archive would exceed MAX_MEMBER_BYTES = {MAX_MEMBER_BYTES} per file or "
                               f"MAX_ARCHIVE_BYTES = {MAX_ARCHIVE_BYTES} in all; `zoo release unpack` would refuse it")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for arcname, p in files:
                info = tar.gettarinfo(p, arcname=f"{ARCHIVE_ROOT}/{arcname}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(p, "rb") as f:
                    tar.addfile(info, f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _CappedStream:
    """The decompressed tar stream, read-only, refusing any read or seek past `cap` bytes: whatever a header
    declares (a member's size, a pax record, a long name), tarfile never reads or skips more than that."""

    def __init__(self, raw, cap: int, archive: Path):
        self.raw, self.cap, self.archive = raw, cap, archive

    def _within(self, end: int) -> None:
        if end > self.cap:
            raise ReleaseError(f"{self.archive}: its tar stream runs past {self.cap} bytes (MAX_TAR_STREAM, "
                               "bytes of tar data read at most); refusing it before extracting anything")

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, size: int = -1) -> bytes:
        pos = self.raw.tell()
        if size is None or size < 0:
            size = self.cap - pos
        self._within(pos + size)
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self.raw.tell() if whence == 1 else 0)
        if whence not in (0, 1):
            raise OSError("a release archive is read front to back")
        self._within(target)
        return self.raw.seek(target)


class _NotAnArchive:
    """Turns what tarfile and gzip raise on a file that is not a whole .tar.gz into one-line ReleaseErrors."""

    def __init__(self, archive: Path):
        self.archive = archive

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        import zlib

        if e is None or isinstance(e, ReleaseError):
            return False
        if isinstance(e, (tarfile.TarError, EOFError, zlib.error, OSError, ValueError)):  # gzip.BadGzipFile: OSError
            detail = " ".join(str(e).split())[:200] or "no detail"
            raise ReleaseError(f"{self.archive}: {NOT_AN_ARCHIVE}: {type(e).__name__}: {detail}") from None
        return False


def _member_parts(m: tarfile.TarInfo, archive: Path) -> tuple[str, ...]:
    """The member's path, normalised ('.' and empty components dropped), checked to stay under release/."""
    name = m.name
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if (not parts or parts[0] != ARCHIVE_ROOT or name.startswith("/") or ".." in parts
            or any("\\" in p or "\0" in p for p in parts)):
        raise ReleaseError(f"{archive}: refusing archive member {name!r} (only regular files under {ARCHIVE_ROOT}/)")
    return parts


def _archive_members(tar: tarfile.TarFile, archive: Path) -> list[tuple[tarfile.TarInfo, tuple[str, ...]]]:
    """Every member's header checked, before anything is extracted: a normalised path under release/ at
    most one folder deep, each name once, a plain regular file (directories are skipped), not sparse, its
    declared size within MAX_MEMBER_BYTES and the total within MAX_ARCHIVE_BYTES. Headers are read one
    by one, so a member is refused before tarfile skips (decompresses) its data."""
    files: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    seen: set[str] = set()
    folders: set[str] = set()
    total = count = 0
    with _NotAnArchive(archive):
        while True:
            m = tar.next()
            if m is None:
                break
            count += 1
            if count > MAX_MEMBERS:
                raise ReleaseError(f"{archive}: more than MAX_MEMBERS = {MAX_MEMBERS} members; refusing it")
            parts = _member_parts(m, archive)
            key = "/".join(parts).casefold()  # one name once, also on a case-insensitive file system
            if key in seen:
                raise ReleaseError(f"{archive}: archive member {m.name!r} appears twice; refusing the archive")
            seen.add(key)
            if m.type == tarfile.DIRTYPE:
                if len(parts) > 2:
                    raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (a folder below an entry folder)")
                continue
            if m.size > MAX_MEMBER_BYTES:
                raise ReleaseError(f"{archive}: archive member {m.name!r} declares {m.size} bytes, over "
                                   f"MAX_MEMBER_BYTES = {MAX_MEMBER_BYTES} (bytes one member may hold); refusing it "
                                   "before extracting anything")
            total += m.size
            if total > MAX_ARCHIVE_BYTES:
                raise ReleaseError(f"{archive}: archive members up to {m.name!r} declare {total} bytes, over "
                                   f"MAX_ARCHIVE_BYTES = {MAX_ARCHIVE_BYTES} (bytes all members may hold); refusing "
                                   "it before extracting anything")
            if m.issparse() or m.type == tarfile.GNUTYPE_SPARSE or any(k.startswith("GNU.sparse") for k in m.pax_headers):
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (a sparse file; only plain regular files)")
            if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                kind = {tarfile.SYMTYPE: "a symlink", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a device",
                        tarfile.BLKTYPE: "a device", tarfile.FIFOTYPE: "a FIFO"}.get(m.type, f"tar type {m.type!r}")
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} ({kind}; only regular files under "
                                   f"{ARCHIVE_ROOT}/)")
            if len(parts) not in (2, 3):
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (files are {ARCHIVE_ROOT}/<file> "
                                   f"or {ARCHIVE_ROOT}/<entry>/<file>)")
            files.append((m, parts))
            folders.update("/".join(parts[:i]).casefold() for i in range(2, len(parts)))
        stream = tar.fileobj  # after the end-of-archive blocks: zero padding only (reading it checks the gzip CRC)
        while chunk := stream.raw.read(min(_CHUNK, stream.cap - stream.tell() + 1)):
            if chunk.strip(b"\0") or stream.tell() > stream.cap:
                raise ReleaseError(f"{archive}: data after the end of its tar archive; refusing it")
    clash = sorted(folders & {"/".join(p).casefold() for _, p in files})
    if clash:
        raise ReleaseError(f"{archive}: archive member {clash[0]!r} is both a file and a folder; refusing the archive")
    return files


def _extract_members(tar: tarfile.TarFile, files, into: Path, archive: Path) -> None:
    """Write the checked members below `into` as new regular files, reading at most each one's declared size."""
    for m, parts in files:
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _NotAnArchive(archive):
            source = tar.extractfile(m)
        with open(target, "xb") as out:
            left = m.size
            while left:
                with _NotAnArchive(archive):
                    chunk = source.read(min(left, _CHUNK))
                if not chunk:
                    raise ReleaseError(f"{archive}: archive member {m.name!r} ends after {m.size - left} of the "
                                       f"{m.size} bytes it declares; refusing the archive")
                out.write(chunk)
                left -= len(chunk)


def _verified_index(staged: Path, archive: Path, adopt_index: bool) -> dict:
    """The archive's index, checked: it covers every folder in the archive, and every entry folder holds
    exactly its row's files with their hashes. Default: every row is the shipped (trust root) row."""

    def where(e: Exception) -> str:
        return f"{archive}: " + str(e).replace(str(staged), ARCHIVE_ROOT)

    if not (staged / INDEX_JSON).is_file():
        raise ReleaseError(f"{archive}: carries no {ARCHIVE_ROOT}/{INDEX_JSON}; refusing it")
    try:
        index = read_index(staged)
    except ReleaseError as e:
        raise ReleaseError(where(e)) from None
    covered = {INDEX_JSON, INDEX_MD, *index["entries"]}
    strays = sorted(p.name for p in staged.iterdir() if p.name not in covered)
    if strays:  # nothing the index does not vouch for is installed
        raise ReleaseError(f"{archive}: members not covered by its index: {', '.join(strays)}")
    rows = index["entries"]
    if not adopt_index:  # the shipped index is the trust root: the archive may carry a subset of its rows, unchanged
        shipped_path = release_dir() / INDEX_JSON
        shipped = read_index()
        if index.get("version") != shipped.get("version"):
            raise ReleaseError(f"{archive}: its index is release {index.get('version')!r}, the shipped index "
                               f"({shipped_path}) is {shipped.get('version')!r}; refusing it (a new release built "
                               "elsewhere is adopted with --adopt-index)")
        for name, row in rows.items():
            if shipped["entries"].get(name) != row:
                what = "is not in" if name not in shipped["entries"] else "differs from"
                raise ReleaseError(f"{archive}: its index row for {name} {what} the shipped index ({shipped_path}); "
                                   "refusing it (a new release built elsewhere is adopted with --adopt-index)")
    for name, row in rows.items():
        try:
            verify_folder(staged / name, row)
        except ReleaseError as e:
            raise ReleaseError(where(e)) from None
    return index


def _install(staged: Path, dest: Path, names: list[str], aside_in: Path) -> None:
    """Move staged/<name> to dest/<name> for each name: what was there is moved aside first and deleted only
    once every name is in place; if any move fails, everything is put back as it was."""
    aside = Path(tempfile.mkdtemp(dir=aside_in, prefix=".unpack-old-"))
    moved: list[str] = []
    installed: list[str] = []
    try:
        for name in names:
            target = dest / name
            if target.exists() or target.is_symlink():
                os.replace(target, aside / name)
                moved.append(name)
            os.replace(staged / name, target)
            installed.append(name)
    except BaseException:
        for name in reversed(installed):
            try:
                os.replace(dest / name, staged / name)
            except OSError:
                pass
        for name in reversed(moved):
            try:
                os.replace(aside / name, dest / name)
            except OSError:
                pass
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _install_verified(staged: Path, archive: Path, dest: Path, anchor: Path, *, adopt_index: bool,
                      into_trust_root: bool) -> dict:
    """Verify the staged release (`_verified_index`), then move it into `dest`; returns the archive's index."""
    staged.mkdir(exist_ok=True)
    index = _verified_index(staged, archive, adopt_index)
    names = sorted(index["entries"])
    if adopt_index or not into_trust_root:  # the trust root's own index is never replaced by default
        if not adopt_index or not (staged / INDEX_MD).is_file():
            # INDEX.md is not hashed by the index: by default it is rendered here from the verified rows
            try:
                (staged / INDEX_MD).write_text(index_markdown(index))
            except (KeyError, TypeError, ValueError) as e:
                raise ReleaseError(f"{archive}: cannot render {INDEX_MD} from its index ({type(e).__name__}: "
                                   f"{str(e)[:200]})") from None
        names += [INDEX_MD, INDEX_JSON]  # the index last: it never vouches for folders not yet in place
    if dest.exists():
        _install(staged, dest, names, anchor)
        return index
    for p in staged.iterdir():  # a new dest: only what is installed, all at once by one rename
        if p.name not in names:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, dest)
    return index


def unpack_archive(path: Path, dest: Path, *, adopt_index: bool = False) -> Path:
    """Unpack a release archive (`write_archive`) into `dest` (a `release/` folder).

    Every member's tar header is checked before anything is extracted (`_archive_members`: regular files
    under release/ only, each name once, within MAX_MEMBER_BYTES / MAX_ARCHIVE_BYTES); the files are staged
    and checked, and `dest` changes only once all of them verified. By default each entry folder is
    verified against the SHIPPED index (`read_index()`, the trust root): the archive's index rows must
    equal the shipped rows of the entries it carries; unpacked into the trust root itself, its index is
    kept. `adopt_index=True` (`zoo release unpack --adopt-index`, a new release built elsewhere) checks
    each folder against the archive's own index instead, and that index becomes the trust root of `dest`.
    Errors are one-line ReleaseErrors naming the archive."""
    import sys

    path, dest = Path(path), Path(dest)
    if not path.is_file():
        raise ReleaseError(f"{path}: {NOT_AN_ARCHIVE}: {'a folder' if path.is_dir() else 'no such file'}")
    if dest.exists() and not dest.is_dir():
        raise ReleaseError(f"{dest}: not a folder; cannot unpack {path} into it")
    into_trust_root = dest.exists() and release_dir().exists() and dest.resolve() == release_dir().resolve()
    # Staging (and the old files moved aside) lie in the nearest existing folder above `dest`, on dest's file
    # system (inside dest, as dotted folders never archived, if it is a mount point): dest is untouched until
    # everything verified, and each file moves into it by a rename.
    anchor = next(p for p in dest.absolute().parents if p.is_dir())
    if dest.is_dir() and os.stat(dest).st_dev != os.stat(anchor).st_dev:
        anchor = dest
    import gzip

    with gzip.GzipFile(path, "rb") as raw:
        with _NotAnArchive(path):
            tar = tarfile.open(fileobj=_CappedStream(raw, MAX_TAR_STREAM, path), mode="r:")  # noqa: SIM115 (`with tar` below)
        with tar:
            files = _archive_members(tar, path)
            with tempfile.TemporaryDirectory(dir=anchor, prefix=".unpack-") as tmp:
                _extract_members(tar, files, Path(tmp), path)
                index = _install_verified(Path(tmp) / ARCHIVE_ROOT, path, dest, anchor, adopt_index=adopt_index,
                                          into_trust_root=into_trust_root)
    if adopt_index:
        orphans = sorted(p.name for p in dest.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and p.name not in index["entries"])
        print(f"--adopt-index: the index of {path} (release {index.get('version')}, {len(index['entries'])} entries) "
              f"is now the trust root of {dest}; its files were checked against that index, not against the one "
              "shipped before" + (f". Folders it does not list: {', '.join(orphans)}" if orphans else ""),
              file=sys.stderr)
    return dest


# ---------------------------------------------------------------- hub
def import_to_hub(hub_root: Path, root: Path | None = None, *, only: list[str] | None = None, datasets: bool = True,
                  progress: bool = True) -> dict:
    """Publish every released folder as model repo `icl-zoo/<entry>` and each task's frozen splits as
    dataset repo `icl-zoo/<task>` on the local hub at `hub_root`, each tagged with the release version."""
    from zoo.publishing.hub import dataset_folder, publish_local, tag_local

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

    from zoo.publishing.hub import dataset_folder, publish_hub, validate_repo_id

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
                folder, _ = dataset_folder(task, Path(tmp) / task, repo=repo, revision=version)  # the card's own id and tag
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
    hashes verified first) and regenerate its index row (fingerprint, checks and verdict included):
    for a change to the cards, the index, or an entry's expected values, notes or departures.
    Claims that eval_results.json cannot answer (the paired gap to GD) are measured here from the
    checkpoint on its frozen test split.
    With `graphs`, also re-export its ONNX graphs from the same weights (for a change to the
    export, e.g. a new graph) and record their hashes in config.json."""
    from export.onnx_export import export_checkpoint_graphs
    from zoo.storage.card import write_card_and_figures
    from zoo.storage.checkpoint import read_checkpoint
    from zoo.storage.manifest import GRAPH_FILES, read_config_core
    from zoo.storage.save import add_graphs

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
            staged = _staging(root, name)
            for path in sorted((root / name).iterdir()):
                shutil.copyfile(path, staged / path.name)
            add_graphs(ckpt, staged, export_checkpoint_graphs)  # the graphs, and their hashes in config.json
            write_card_and_figures(read_checkpoint(staged), staged, extra_metrics=remeasured)  # the new hashes verify
            _swap_in(root, name, staged)
        elif "expected" in read_config_core(root / name)["entry"]:
            # a config.json of an older save keeps a copy of the expected values (tolerances the card no longer
            # shows): saved again without it, the same tensors and graphs, the weights' header naming the new config
            staged = _staging(root, name)
            for path in sorted((root / name).iterdir()):
                shutil.copyfile(path, staged / path.name)
            ckpt.save_files(staged, graphs=lambda _ckpt, folder: [folder / g for g in GRAPH_FILES if (folder / g).is_file()])
            write_card_and_figures(read_checkpoint(staged), staged, extra_metrics=remeasured)
            _swap_in(root, name, staged)
        else:
            write_card_and_figures(ckpt, root / name, extra_metrics=remeasured)
        index["entries"][name] = index_row(name, root / name, build_seconds=row.get("build_seconds"),
                                           steps_per_second=row.get("steps_per_second"), remeasured=remeasured)
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

    from zoo.running.train import can_compile, default_device

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
