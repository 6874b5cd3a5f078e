"""`zoo build` and `zoo sweep`: construct or train entries, one or a grid of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import zoo
from zoo.cli.output import add_command, print_json, print_metrics

TRACK_ALIGNMENT_HELP = ("record the prediction and sensitivity L2 errors and the sensitivity cosine to the entry's GD "
                        "reference on 2,000 validation tasks at every eval step, in the history and the card's plot "
                        "(blogpost Figure 10); the weights are unchanged")


def training_process() -> None:
    """A command that trains flushes denormals before torch starts its threads (zoo/running/train.py), and pins
    the source commit its checkpoints record to the tree it started from (zoo.storage.checkpoint.pin_source_commit)."""
    # deferred: imports torch
    from zoo.running.train import flush_denormals_in_this_process
    from zoo.storage.checkpoint import pin_source_commit

    flush_denormals_in_this_process()
    pin_source_commit()


def cmd_build(args) -> int:
    """Build the entry into --out; its metrics as `name: value` lines, or with --json as JSON alone on stdout."""
    training_process()
    out = Path(args.out or Path("checkpoints") / args.name)
    ckpt = zoo.build(args.name, out, steps=args.steps, device=args.device, seed=args.seed, progress=not args.quiet,
                     compiled=args.compile, track_alignment=args.track_alignment, force=args.force,
                     graphs=not args.no_graphs)
    print(f"built {args.name} → {out}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json(ckpt.metrics)
    else:
        print_metrics(ckpt.metrics)
    return 0


def parse_value(text: str):
    """A --set value: JSON when it parses (numbers, true/false, lists), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def sweep_update(args, spec) -> dict:
    """The spec's fields that the command line replaces (--steps, --only, --seeds, --set …)."""
    update = {"steps": args.steps} if args.steps else {}
    for flag, field in (("ensemble", "ensemble"), ("compile", "compiled"), ("track_alignment", "track_alignment")):
        if getattr(args, flag):
            update[field] = True
    if args.only:
        unknown = [e for e in args.only if e not in spec.entries]
        if unknown:
            raise ValueError(f"--only {' '.join(unknown)}: not in {args.spec}, whose entries are {', '.join(spec.entries)}")
        update["entries"] = [e for e in spec.entries if e in args.only]
    if args.seeds:
        update["seeds"] = args.seeds
    if args.set:
        grid = dict(spec.grid)
        for item in args.set:
            field, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
            grid[field] = [parse_value(value)]
        update["grid"] = grid
    return update


def cmd_sweep(args) -> int:
    training_process()
    # deferred: imports pydantic and numpy (~0.2 s)
    from zoo.running.sweep import load_spec, markdown_table, path_component, run_sweep

    spec = load_spec(args.spec)
    spec = spec.model_copy(update=sweep_update(args, spec))
    out = Path(args.out or Path("runs") / path_component(spec.name, "sweep name"))  # run_sweep's default, said below
    rows = run_sweep(spec, out, backend=args.backend, address=args.address, gpus_per_run=args.gpus_per_run,
                     workers=args.workers, progress=not args.quiet)
    print(markdown_table(rows), end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {len(rows)} checkpoint folders in {out}",
          file=sys.stderr)  # stderr: stdout is the table alone
    return 0


def register(sub) -> None:
    s = add_command(sub, "build", "construct or train an entry, evaluate it and save a checkpoint folder",
                    "zoo build lsa-gd-zucchet-icl --out ckpt/gd",
                    "zoo build mamba-1d --out ckpt/quick --steps 200 --no-graphs --json")
    s.add_argument("name", help="registry entry name (`zoo list` shows them)")
    s.add_argument("--out", help="output folder (default checkpoints/NAME)")
    s.add_argument("--steps", type=int, help="override the recipe's training steps")
    s.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if available)")
    s.add_argument("--seed", type=int)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--compile", action="store_true",
                   help="train through torch.compile: ~10–60 s to compile, then up to 2.5–6× the steps/s on a CPU for "
                        "scan-heavy and small models, ~1× for LSTM/GRU (benchmarks/train_throughput.py); "
                        "same data and losses to rounding")
    s.add_argument("--track-alignment", action="store_true", help=TRACK_ALIGNMENT_HELP)
    s.add_argument("--no-graphs", action="store_true",
                   help="write no ONNX graphs (most of a short run's time); `zoo export OUT` adds them later")
    s.add_argument("--force", action="store_true",
                   help="replace an --out folder that holds another entry's (or run's) checkpoint, entirely")
    s.add_argument("--json", action="store_true", help="print the metrics as JSON, and nothing else, on stdout")
    s.set_defaults(fn=cmd_build)

    s = add_command(sub, "sweep", "run a sweep spec (entries × seeds × overrides) and write one results table",
                    "zoo sweep sweeps/context-size.toml --seeds 0 1 --steps 500",
                    "zoo sweep sweeps/context-size.toml --set source.lr=3e-3 --backend ray")
    s.add_argument("spec", help="sweep TOML (see zoo/running/sweep.py and sweeps/)")
    s.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local (this process, or --workers processes) or Ray tasks on a cluster")
    s.add_argument("--workers", type=int, default=1, help="local backend: groups of runs at once in separate processes")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray instance)")
    s.add_argument("--gpus-per-run", type=float, default=0.0, help="Ray: fraction of a GPU per run")
    s.add_argument("--out", help="output folder (default: runs/<spec name>)")
    s.add_argument("--steps", type=int, help="override the spec's step count")
    s.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override an entry field in every run, e.g. --set source.lr=3e-3 (repeatable)")
    s.add_argument("--ensemble", action="store_true", help="train each entry's seeds as one batched ensemble")
    s.add_argument("--compile", action="store_true", help="train through torch.compile (long runs on a CPU)")
    s.add_argument("--track-alignment", action="store_true", help=TRACK_ALIGNMENT_HELP)
    s.add_argument("--only", nargs="+", metavar="ENTRY", help="run only these of the spec's entries")
    s.add_argument("--seeds", nargs="+", type=int, help="replace the spec's seeds")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_sweep)
