"""`zoo eval`, `zoo leaderboard`, `zoo report`: score checkpoints and outside models beside GD and
least squares, on the registry's frozen splits."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import zoo
from zoo.cli.output import add_command, print_json, print_metrics
from zoo.storage.atomic import write_text

CHECKPOINT_ONLY_FLAGS = ("dataset", "input_scales", "weights", "loops", "gd_etas", "plot")
BENCHMARK_ONLY_FLAGS = ("time_limit", "memory_limit", "output_limit")


def register_variant_task(ckpt):
    """A checkpoint trained on a task variant (a sweep's task.* override) carries its task spec."""
    # deferred: imports torch
    from zoo.science.registry import default_registry

    return default_registry().tasks.setdefault(ckpt.entry.task, ckpt.task_spec)


def cmd_eval(args) -> int:
    """A zoo checkpoint on its frozen split (or --dataset's download), with the curves and figures asked
    for; --task, --check or an ONNX file: the open benchmark (cmd_benchmark)."""
    if args.task or args.check or args.path.endswith(".onnx"):
        return cmd_benchmark(args)
    used = [f"--{flag.replace('_', '-')}" for flag in BENCHMARK_ONLY_FLAGS if getattr(args, flag) is not None]
    if used:
        raise ValueError(f"{', '.join(used)}: only for an outside model, scored with --task or --check")
    if args.dataset and args.split != "test":
        raise ValueError("--dataset downloads the test split; score the validation split from the registry's seeds")
    if args.plot and args.loops and args.gd_etas:
        raise ValueError("--plot draws one figure: give it with --loops or with --gd-etas, not both")
    # deferred: imports torch
    from zoo.science.evaluation import gd_reference, rescore

    ckpt = zoo.load(args.path, revision=args.revision, endpoint=args.endpoint)
    split, checked_against = eval_split(args, ckpt)
    reference = gd_reference(ckpt.entry, ckpt.task, ckpt.construction, recorded=ckpt.metrics)
    metrics = rescore(ckpt, split)
    metrics["dataset"] = split.name
    metrics["dataset_sha256"] = split.sha256
    if checked_against is not None:
        metrics["dataset_checked_against"] = checked_against
    add_curves(args, ckpt, split, reference, metrics)
    if args.json:
        print_json(metrics)
    else:
        print_metrics(metrics)
    return 0


def eval_split(args, ckpt):
    """The split to score and what its hash was checked against: the registry's frozen split (hash-checked
    against the registry), or --dataset's download, checked against the hash eval_dataset_hash chooses."""
    # deferred: these import torch
    from zoo.science.registry import default_registry
    from zoo.science.tasks.frozen import load_split, load_split_from_hub

    registered = default_registry().tasks.get(ckpt.entry.task)  # before the checkpoint's own spec is added
    spec = register_variant_task(ckpt)
    if not args.dataset:
        return load_split(ckpt.entry.task, args.split, spec=spec), None
    expected, checked_against = eval_dataset_hash(args, ckpt, registered)
    split = load_split_from_hub(args.dataset, split="test", revision=args.dataset_revision, expected_sha256=expected,
                                endpoint=args.endpoint, spec=registered or ckpt.task_spec)
    return split, checked_against


def eval_dataset_hash(args, ckpt, registered) -> tuple[str, str]:
    """The hash a --dataset download must have, and whose it is. For a task the registry knows, the
    registry's: a checkpoint's own claim would let a rigged checkpoint vouch for a rigged split."""
    task = ckpt.entry.task
    claim = ckpt.provenance.get("dataset_hashes", {}).get("test")
    pinned = registered.splits["test"].sha256 if registered is not None and "test" in registered.splits else None
    if pinned is not None:  # a task of the registry files (a variant registered in this process pins none)
        if claim is not None and claim != pinned:
            print(f"warning: the checkpoint claims {task}/test has SHA-256 {claim}, but the registry "
                  f"records {pinned}; the download is checked against the registry's", file=sys.stderr)
        return pinned, "registry"
    own = ckpt.task_spec.splits.get("test")
    expected = claim or (own.sha256 if own is not None else None)
    if expected is None:
        raise ValueError(f"--dataset {args.dataset}: neither the checkpoint nor the registry records the hash of "
                         f"{task}/test, so the download cannot be hash-checked; refusing to score it")
    return expected, f"the checkpoint's own claim (the registry has no {task}/test; not checked against the registry)"


def add_curves(args, ckpt, split, reference: dict, metrics: dict) -> None:
    """--input-scales, --weights, --gd-etas, --loops: their curves into `metrics`, their figures drawn."""
    # deferred: these import torch
    import torch

    from zoo.science import evaluation

    task, title = ckpt.task, ckpt.entry.name
    if args.input_scales:
        metrics["input_scale_curve"] = evaluation.input_scale_curve(ckpt.model, task, args.input_scales, **reference)
    if args.weights:
        # deferred: imports torch
        from zoo.science.analysis.gd_ssm_kernels import compare_with_construction

        result = compare_with_construction(ckpt.model, task, reference.get("eta"))
        draw("gd_ssm_kernel_figure", result, args.weights, title)
        metrics["weights_vs_construction"] = {k: v for k, v in result.items() if k != "matrices"}
    if args.gd_etas:
        metrics["gd_rate_curve"] = evaluation.gd_rate_curve(ckpt.model, task, split.batch(task), args.gd_etas)
        if args.plot:
            draw("gd_rate_figure", metrics["gd_rate_curve"], args.plot, title)
    if args.loops:
        batch = split.batch(task, dtype=torch.float64)
        metrics["loop_curve"] = evaluation.loop_curve(ckpt.model.double(), task, batch, args.loops, args.dampings,
                                                      eta=reference.get("eta"), zero_x_updates=args.zero_x_updates)
        if args.plot:
            draw("loop_curve_figure", metrics["loop_curve"], args.plot, title)


def draw(figure: str, data, path, title: str) -> None:
    """One of zoo.science.analysis.plots' figures, saved at `path`; `wrote PATH` on stderr, so that
    --json leaves stdout to the JSON."""
    # deferred: imports matplotlib and torch
    from zoo.science.analysis import plots

    getattr(plots, figure)(data, path, title=title)
    print(f"wrote {path}", file=sys.stderr)


def cmd_benchmark(args) -> int:
    """`zoo eval MODEL --task TASK`: any model on a frozen split with the card's metrics (zoo/publishing/benchmark.py);
    `zoo eval --check RECORD MODEL`: score it again and confirm or refute the record (exit 1 when refuted)."""
    # deferred: imports torch
    from zoo.publishing import benchmark

    used = [f"--{flag.replace('_', '-')}" for flag in CHECKPOINT_ONLY_FLAGS if getattr(args, flag)]
    if used:
        raise ValueError(f"{', '.join(used)}: only for a zoo checkpoint scored without --task or --check")
    if args.check:
        try:
            record = json.loads(Path(args.check).read_text())
        except ValueError as e:
            raise ValueError(f"{args.check}: not a JSON benchmark record ({e})") from None
        if args.task and isinstance(record, dict) and record.get("task") != args.task:
            raise ValueError(f"--task {args.task}: the record {args.check} was scored on {record.get('task')!r}")
        verdict = benchmark.check(record if isinstance(record, dict) else {}, args.path, revision=args.revision,
                                  endpoint=args.endpoint, **limit_args(args))
        print(verdict.message)
        return 0 if verdict.confirmed else 1
    if not args.task:
        raise ValueError(f"{args.path}: give the task whose frozen split to score it on, --task TASK "
                         "(`zoo show ENTRY` shows an entry's task)")
    record = benchmark.evaluate(args.path, task=args.task, split=args.split, revision=args.revision,
                                endpoint=args.endpoint, **limit_args(args))
    if args.out:  # only a scored model gets a record: a failure above leaves nothing behind
        write_text(args.out, json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)  # stderr: with --json, stdout is the record alone
    if args.json:
        print_json(record)
    else:
        print("\n".join(benchmark.summary_lines(record)))
    return 0


def cmd_leaderboard(args) -> int:
    """Rank the released entries on a task, GD, least squares and `--add` models; print and draw the table."""
    # deferred: imports torch
    from zoo.publishing.leaderboard import leaderboard, markdown_table, write

    add = {}
    for item in args.add:
        name, sep, model = item.partition("=")
        name = name.strip()
        if not (sep and name and model) or name in add:
            raise ValueError(f"--add {item!r}: expected NAME=MODEL with a new NAME (MODEL: an ONNX file, a Hub repo "
                             "holding one, or a checkpoint)")
        add[name] = model
    # deferred: imports torch
    from zoo.publishing.benchmark import bounds

    with bounds(**limit_args(args)):  # the --add models' ONNX graphs run under these
        board = leaderboard(args.task, split=args.split, add=add, entries=args.only,
                            progress=None if args.quiet else lambda name: print(f"scoring {name}", file=sys.stderr))
    if args.json:
        print_json(dataclasses.asdict(board))
    else:
        print(markdown_table(board), end="")
    for path in write(board, Path(args.out)):  # after every model is scored: a failure writes nothing
        print(f"wrote {path}", file=sys.stderr)
    return 0


SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """BYTES, or with a suffix K, M, G or T (powers of 1024; `2G`, `512M`, `1.5GiB`): a positive int."""
    body = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = body[-1:] if body[-1:] in SIZE_SUFFIXES and body[-1:] else ""
    try:
        value = float(body[:-1] if unit else body) * SIZE_SUFFIXES[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes, e.g. 2G, 512M or 1000000") from None
    if not (value >= 1 and value < 2**63):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive size, e.g. 2G")
    return int(value)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def limit_args(args) -> dict:
    """--time-limit, --memory-limit, --output-limit as `zoo.publishing.benchmark` takes them (None: the default)."""
    return {"time_limit": args.time_limit, "memory_limit": args.memory_limit, "output_limit": args.output_limit}


def add_limit_flags(s) -> None:
    group = s.add_argument_group("limits on an outside ONNX graph (each ends it in one line naming the limit)")
    group.add_argument("--time-limit", type=seconds, metavar="SECONDS",
                       help="wall-clock seconds the graph may take to open, and for each pass over up to 2500 "
                            "tasks (default 600)")
    group.add_argument("--memory-limit", type=byte_size, metavar="BYTES",
                       help="memory the graph may take above its process's start, e.g. 2G or 512M (default 2G)")
    group.add_argument("--output-limit", type=byte_size, metavar="BYTES",
                       help="bytes one call of the graph may return, e.g. 256M (default 256M)")


def cmd_report(args) -> int:
    # deferred: imports torch
    from zoo.publishing.report import collect, write_report

    rows = collect(args.paths, input_scales=args.input_scales, weights=args.weights)
    for path in write_report(rows, Path(args.out)):
        print(f"wrote {path}")
    print((Path(args.out) / "report.md").read_text())
    return 0


def register(sub) -> None:
    register_eval(sub)
    s = add_command(sub, "leaderboard", "rank the released entries on a task beside GD, least squares and your models",
                    "zoo leaderboard zucchet-icl --add mine=my_model.onnx --out board")
    s.add_argument("task", help="task name (`zoo show ENTRY` shows an entry's task)")
    s.add_argument("--add", action="append", default=[], metavar="NAME=MODEL",
                   help="also score MODEL (an ONNX file, a Hub repo holding one, a checkpoint) as NAME (repeatable)")
    s.add_argument("--only", nargs="+", metavar="ENTRY", help="of the released entries, rank only these")
    s.add_argument("--split", choices=["test", "validation"], default="test")
    s.add_argument("--out", default="leaderboards", help="folder for TASK.md and TASK.png (default: leaderboards)")
    s.add_argument("--json", action="store_true", help="print the ranked rows as JSON instead of the table")
    s.add_argument("--quiet", action="store_true")
    add_limit_flags(s)
    s.set_defaults(fn=cmd_leaderboard)

    s = add_command(sub, "report", "compare checkpoints (or sweep folders) with GD and least squares",
                    "zoo report runs/context-size --out report")
    s.add_argument("paths", nargs="+", help="checkpoint folders, folders holding them, or a report's results.json "
                                            "(regenerates its tables and figures)")
    s.add_argument("--out", default="report", help="folder for report.md and report.png")
    s.add_argument("--input-scales", type=float, nargs="+", metavar="ALPHA",
                   help="also score each checkpoint on inputs scaled by ALPHA, beside GD (Sushma, Tian et al. Figs. 1D/2D)")
    s.add_argument("--weights", action="store_true",
                   help="one-layer GD-SSMs: compare each with the construction up to the weights' symmetries (Fig. 3)")
    s.set_defaults(fn=cmd_report)


def register_eval(sub) -> None:
    s = add_command(sub, "eval", "score a checkpoint (folder or Hub repo), or with --task any model, on a frozen split",
                    "zoo eval ckpt/lsa --json", "zoo eval my_model.onnx --task zucchet-icl --out result.json")
    s.add_argument("path", help="checkpoint folder or ORG/NAME; with --task or --check also an ONNX file")
    s.add_argument("--split", choices=["test", "validation"], default="test",
                   help="frozen split to score (validation: e.g. Zucchet's shifted W* ~ N(0, 2/3), what Figs. 4–5 report)")
    s.add_argument("--revision")
    s.add_argument("--dataset", help="Hub dataset repo ORG/NAME holding the frozen test split")
    s.add_argument("--dataset-revision")
    s.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    s.add_argument("--input-scales", type=float, nargs="+", metavar="ALPHA",
                   help="also score inputs scaled by ALPHA (out of distribution), beside GD at the same η")
    s.add_argument("--weights", metavar="PNG", type=Path,
                   help="one-layer GD-SSM: compare its weights with the construction's up to their symmetries "
                        "(Sushma, Tian et al. Fig. 3) and save the figure here")
    s.add_argument("--loops", type=int, nargs="+", metavar="K",
                   help="one-layer LSA: also score it applied K times (blogpost Figure 13), beside K GD steps")
    s.add_argument("--dampings", type=float, nargs="+", default=[1.0, 0.75], metavar="LAMBDA",
                   help="with --loops: dampening factors λ (e ← e + λ·layer(e)); default 1 0.75")
    s.add_argument("--zero-x-updates", action="store_true",
                   help="with --loops: zero W_P's x-rows first (one application never reads them; see loop_curve)")
    s.add_argument("--gd-etas", type=float, nargs="+", metavar="ETA",
                   help="also compare the model with one GD step at each rate ETA (blogpost Figure 12)")
    s.add_argument("--plot", metavar="PNG", help="with --loops or --gd-etas: save that figure here")
    s.add_argument("--json", action="store_true", help="print the metrics (or the --task record) as JSON alone")
    s.add_argument("--task", help="score any model — an ONNX file, a Hub repo holding one, a checkpoint — on this task's "
                                  "frozen split, beside GD and least squares (the open benchmark, zoo/publishing/benchmark.py)")
    s.add_argument("--check", metavar="RECORD", help="score the model again as RECORD (a --json/--out record) says, "
                                                     "and confirm or refute it (exit 1 when refuted)")
    s.add_argument("--out", metavar="JSON", help="with --task: also write the record here (only if scoring succeeds)")
    add_limit_flags(s)
    s.set_defaults(fn=cmd_eval)
