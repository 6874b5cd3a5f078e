"""Sweeps: a TOML grid of entries × seeds × field overrides, run locally or on Ray, gathered
into one results table. Every run is an ordinary checkpoint folder (publish/stream as usual).

    name = "figure-3b"
    entries = ["gated-rnn-zucchet-icl"]
    seeds = [0, 1, 2, 3]
    steps = 20000                       # optional: override every recipe's step count
    [grid]
    "arch.hidden" = [16, 32, 64, 128]   # dotted entry fields → values (Cartesian product)

With `ensemble = true` the seeds of each (entry, overrides) train as one batched ensemble
(zoo/running/ensemble.py); each member is still saved as its own checkpoint.

Runs are named `<entry>--seed<S>[--<field>=<value>…]` under the sweep's output folder. Each such name,
and the sweep's name when it names the output folder, must be one plain folder name (`path_component`):
a grid or --set value that is not is refused before anything runs. A
finished run (its config.json exists) is skipped, so re-running a sweep after an interruption
resumes it; an interrupted training run resumes from its own training state.
"""

from __future__ import annotations

import itertools
import json
import sys
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo.running.executor import Backend, Job, run_jobs
from zoo.science.metrics import METRICS
from zoo.science.registry import Entry, get_entry, with_overrides

RESULT_COLUMNS = tuple(m.key for m in METRICS if m.in_sweeps)
MAX_NAME_BYTES = 200  # a run's folder name (UTF-8); its staged and lock siblings add ~20 to it, under NAME_MAX 255


def path_component(name: str, what: str) -> str:
    """`name` when it is one plain folder name: not empty, no '/' or '\\', no '..', no leading '.', no control
    characters, at most MAX_NAME_BYTES bytes; else ValueError in one line naming it. Sweep and run names are
    built from the spec's and the command line's values (any string a registry field accepts)."""
    shown = repr(name[:80] + ("…" if len(name) > 80 else "")) if isinstance(name, str) else repr(name)
    if not isinstance(name, str) or not name:
        problem = "is empty"
    elif "/" in name or "\\" in name:
        problem = "holds a path separator ('/' or '\\')"
    elif ".." in name:
        problem = "holds '..'"
    elif name.startswith("."):
        problem = "starts with '.' (a hidden folder)"
    elif any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in name):
        problem = "holds a control character"
    elif len(name.encode("utf-8")) > MAX_NAME_BYTES:
        problem = f"is {len(name.encode('utf-8'))} bytes long, more than the {MAX_NAME_BYTES} a folder name may take here"
    else:
        return name
    raise ValueError(f"{what} {shown} {problem}: it is not one plain folder name; refusing it before anything runs "
                     "(choose other values or another name)")


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # also the default output folder, runs/<name>
    entries: list[str] = Field(min_length=1)  # registry entries
    seeds: list[int] = [0]  # training seeds (constructed entries run once)
    steps: int | None = Field(None, gt=0)  # override every trained entry's step count
    device: str | None = None  # default: CUDA when available
    ensemble: bool = False  # train the seeds of each (entry, overrides) as one batched ensemble (zoo/running/ensemble.py)
    compiled: bool = False  # train through torch.compile (CPU: up to 2.5–6× the steps/s after ~10–60 s compiling per run)
    track_alignment: bool = False  # record the alignment metrics with GD at every eval step (blogpost Figure 10)
    graphs: bool = True  # export each run's ONNX graphs (false: weights, card and results only; `zoo export RUN` adds them)
    grid: dict[str, list[Any]] = {}  # dotted field → values


@dataclass(frozen=True)
class Run:
    entry: str
    seed: int | None
    overrides: dict[str, Any]
    # the entry with its overrides, validated once by `expand`: building the run uses it as it is
    config: Entry = field(compare=False, repr=False)

    def __reduce__(self):
        """Pickled (to a worker process or a Ray task) as its entry, seed and overrides; the receiving process
        validates the config again (its pydantic schemas are built at import, and are not picklable)."""
        return (_run, (self.entry, self.seed, self.overrides))

    @property
    def name(self) -> str:
        parts = [self.entry] + ([f"seed{self.seed}"] if self.seed is not None else [])
        parts += [f"{k.split('.')[-1]}={v}" for k, v in self.overrides.items()]
        return "--".join(parts)


def _run(entry: str, seed: int | None, overrides: dict[str, Any]) -> Run:
    base = get_entry(entry)
    return Run(entry, seed, overrides, with_overrides(base, overrides) if overrides else base)


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        return SweepSpec.model_validate(tomllib.loads(path.read_text()))
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise ValueError(f"{path}: invalid sweep spec:\n{e}") from None


def expand(spec: SweepSpec) -> list[Run]:
    """The runs of a spec, validated against the registry before anything trains (the only time
    a run's entry is validated: each run carries the result)."""
    keys = list(spec.grid)
    runs = []
    for name in spec.entries:
        entry = get_entry(name)
        trained = entry.source.kind == "trained"
        seeds = spec.seeds if trained else [None]
        # seeds and training-recipe fields do not apply to constructed entries
        applicable = [k for k in keys if trained or not k.startswith("source.")]
        combos = itertools.product(*(spec.grid[k] for k in applicable))
        for combo in dict.fromkeys(tuple(zip(applicable, values)) for values in combos):
            overrides = dict(combo)
            config = with_overrides(entry, overrides) if overrides else entry  # fail now, not after hours of training
            for seed in seeds:
                run = Run(name, seed, overrides, config)
                path_component(run.name, "sweep run")  # a folder under the sweep's output folder
                runs.append(run)
    return runs


def run_one(run: Run, out_dir: str, steps: int | None, device: str | None, threads: int | None = None,
            compiled: bool = False, model=None, track_alignment: bool = False, progress: bool = False,
            graphs: bool = True) -> dict:
    """Build one run (or read it back when finished) and return its results row. `model`: the run's
    untrained model when the caller has built it already (`run_group`)."""
    from zoo.running.builder import build
    from zoo.storage.atomic import recover_folder
    from zoo.storage.checkpoint import CONFIG, read_checkpoint

    _limit_threads(threads)
    folder = Path(out_dir) / path_component(run.name, "sweep run")
    recover_folder(folder)  # a finished run that a killed save left renamed aside is finished still
    if (folder / CONFIG).exists():
        return result_row(run, read_checkpoint(folder), "cached")
    _register_task_variant(run)
    ckpt = build(run.config, folder, steps=steps, device=device, seed=run.seed, progress=progress, compiled=compiled,
                 model=model, track_alignment=track_alignment, graphs=graphs)  # progress: the step bar, with its loss
    return result_row(run, ckpt, "built")


def result_row(run: Run, ckpt, status: str) -> dict:
    row = {"run": run.name, "entry": run.entry, "seed": run.seed, **run.overrides, "status": status,
           "steps": ckpt.provenance.get("steps"), "parameters": sum(p.numel() for p in ckpt.model.parameters())}
    row.update({k: ckpt.metrics[k] for k in RESULT_COLUMNS if k in ckpt.metrics})
    return row


def _register_task_variant(run: Run) -> None:
    """`task.*` overrides name a task variant that `expand` registered in its own process; a Ray
    worker is a fresh one, where the variant is registered again (the task, not the entry, is checked)."""
    from zoo.science.registry import default_registry, get_entry, task_variant

    fields = {k.split(".", 1)[1]: v for k, v in run.overrides.items() if k.startswith("task.")}
    if fields and run.config.task not in default_registry().tasks:
        task_variant(get_entry(run.entry).task, fields)


def _limit_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)  # one Ray CPU per run: no oversubscription


def run_group(runs: list[Run], out_dir: str, steps: int | None, device: str | None, threads: int | None = None,
              compiled: bool = False, track_alignment: bool = False, progress: bool = False,
              graphs: bool = True) -> list[dict]:
    """Runs that differ only in their seed: trained together as an ensemble when there are
    several unfinished ones and their model can be vmapped, else built one by one. `progress`: each
    training's step bar with its train and validation loss (zoo.running.train)."""
    from zoo.running.builder import build_ensemble, untrained_model
    from zoo.running.train import training_mode
    from zoo.storage.atomic import recover_folder
    from zoo.storage.checkpoint import CONFIG

    for r in runs:
        recover_folder(Path(out_dir) / path_component(r.name, "sweep run"))
    pending = [r for r in runs if not (Path(out_dir) / r.name / CONFIG).exists()]
    _limit_threads(threads)
    first, model, ensemble = (pending[0] if pending else None), None, False
    if first and first.config.source.kind == "trained":
        # The first run's untrained model, built once: with the recipe it decides the training mode
        # (zoo.running.train.training_mode: an ensemble of the pending seeds, or on a GPU even of one, whose step
        # is then one CUDA graph), then trains as the ensemble's first member or on its own.
        _register_task_variant(first)
        model = untrained_model(first.config, first.seed)
        ensemble = training_mode(model, first.config.source, device, members=len(pending)).ensemble
    if not ensemble:
        return [run_one(r, out_dir, steps, device, compiled=compiled, model=model if r is first else None,
                        track_alignment=track_alignment, progress=progress, graphs=graphs) for r in runs]
    ckpts = build_ensemble(first.config, [r.seed for r in pending], [Path(out_dir) / r.name for r in pending],
                           run_dir=Path(out_dir) / ".ensembles" / first.name.replace(f"--seed{first.seed}", ""),
                           steps=steps, device=device, progress=progress, compiled=compiled, first=model,
                           track_alignment=track_alignment, graphs=graphs)
    built = {r.name: ckpt for r, ckpt in zip(pending, ckpts)}
    return [result_row(r, built[r.name], f"built (ensemble of {len(pending)})") if r.name in built
            else run_one(r, out_dir, steps, device, compiled=compiled, track_alignment=track_alignment, progress=progress,
                         graphs=graphs)
            for r in runs]


def groups_of(runs: list[Run], ensemble: bool) -> list[list[Run]]:
    if not ensemble:
        return [[r] for r in runs]
    grouped: dict[tuple, list[Run]] = {}
    for r in runs:
        grouped.setdefault((r.entry, tuple(r.overrides.items())), []).append(r)
    return list(grouped.values())


def run_sweep(spec: SweepSpec, out: str | Path | None = None, backend: Literal["local", "ray"] = "local",
              address: str | None = None, gpus_per_run: float = 0.0, progress: bool = True, workers: int = 1) -> list[dict]:
    """Run every group of the spec through the one executor (zoo.running.executor): in this process (`workers`
    = 1: each training's step bar shows), in `workers` local processes, or as Ray tasks (`backend="ray"`,
    `address`, `gpus_per_run`). A group's rows are printed as it finishes; results.json/.md hold them all, in
    the spec's order."""
    out = Path(out or Path("runs") / path_component(spec.name, "sweep name"))
    groups = groups_of(expand(spec), spec.ensemble)  # every run's name checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    executor = Backend(backend, workers=workers, address=address, gpus_per_job=gpus_per_run)
    inline = executor.in_process
    jobs = [Job(i, run_group, (g, str(out.resolve()), spec.steps, spec.device),
                {"threads": None if inline else 1, "compiled": spec.compiled, "track_alignment": spec.track_alignment,
                 "progress": progress and inline, "graphs": spec.graphs})
            for i, g in enumerate(groups)]
    results: list[list[dict]] = [[] for _ in groups]
    failures = []
    for i, rows in run_jobs(jobs, executor):
        if isinstance(rows, BaseException):
            failures.append(f"{groups[i][0].name}: {type(rows).__name__}: {rows}")
            continue
        results[i] = rows
        if progress:  # beside the bars, on stderr; stdout keeps the results table
            done = sum(1 for r in results if r)
            for row in rows:
                print(run_line(row) + f"  [{done}/{len(groups)} groups]", file=sys.stderr, flush=True)
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(groups)} groups failed (the others are saved; re-run to retry): "
                           + "; ".join(failures))
    rows = [row for group in results for row in group]
    write_results(rows, out)
    return rows


def run_line(row: dict) -> str:
    """One finished run, as the sweep prints it: name, how it was made, steps and losses."""
    parts = [row["status"]]
    if row.get("steps"):
        parts.append(f"{row['steps']:,} steps")
    if isinstance(row.get("test_loss"), float):
        parts.append(f"test loss {row['test_loss']:.5g}"
                     + (f" (GD {row['gd_loss']:.5g})" if isinstance(row.get("gd_loss"), float) else ""))
    return f"  {row['run']}: " + ", ".join(parts)


def write_results(rows: list[dict], out: Path) -> None:
    """results.json (every column) and results.md (a table) in the sweep folder."""
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    (out / "results.md").write_text(markdown_table(rows))


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no runs)\n"
    columns = [c for c in rows[0] if c not in ("entry", "status")]
    for row in rows[1:]:
        columns += [c for c in row if c not in columns and c not in ("entry", "status")]

    def fmt(v):
        return f"{v:.5g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"
