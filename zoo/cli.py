"""The `zoo` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


# ---------------------------------------------------------------- registry
def cmd_list(args) -> int:
    from zoo.registry import list_entries

    fields = {k: v for k, v in (("arch_type", args.arch), ("source", args.source), ("task", args.task)) if v}
    entries = list_entries(args.filter, **fields)
    if args.json:
        _print_json([{"name": e.name, "arch": e.arch.type, "source": e.source.kind, "task": e.task, "paper": e.paper} for e in entries])
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"icl-zoo: {len(entries)} entries")
    table.add_column("name", no_wrap=True)
    for col in ("arch", "source", "task"):
        table.add_column(col, no_wrap=True)
    table.add_column("reproduces", no_wrap=True, overflow="ellipsis", max_width=60)
    for e in entries:
        table.add_row(e.name, e.arch.type, e.source.kind, e.task, e.paper)
    Console().print(table)
    return 0


def cmd_show(args) -> int:
    from zoo.registry import get_entry, get_task_spec

    e = get_entry(args.name)
    _print_json({"entry": e.model_dump(mode="json"), "task": get_task_spec(e.task).model_dump(mode="json")})
    return 0


# ---------------------------------------------------------------- build / eval
def cmd_build(args) -> int:
    import zoo

    out = Path(args.out or Path("checkpoints") / args.name)
    ckpt = zoo.build(args.name, out, steps=args.steps, device=args.device, seed=args.seed, progress=not args.quiet)
    print(f"built {args.name} → {out}")
    _print_json(ckpt.metrics)
    return 0


def cmd_eval(args) -> int:
    import zoo
    from zoo.evaluate import evaluate
    from zoo.tasks.frozen import load_split, load_split_from_hub

    ckpt = zoo.load(args.path, revision=args.revision, endpoint=args.endpoint)
    task = ckpt.task
    if args.dataset:
        expected = ckpt.provenance.get("dataset_hashes", {}).get("test")
        split = load_split_from_hub(args.dataset, split="test", revision=args.dataset_revision,
                                    expected_sha256=expected, endpoint=args.endpoint)
    else:
        split = load_split(ckpt.entry.task, "test")
    metrics = evaluate(ckpt.model, task, split.batch(task))
    metrics["dataset"] = split.name
    metrics["dataset_sha256"] = split.sha256
    if args.json:
        _print_json(metrics)
    else:
        for k, v in metrics.items():
            print(f"{k:>22}: {v}")
    return 0


def cmd_datasets(args) -> int:
    from zoo.registry import default_registry
    from zoo.tasks.frozen import load_split

    reg = default_registry()
    names = args.tasks or sorted(reg.tasks)
    rows = []
    for name in names:
        for split in reg.task(name).splits:
            s = load_split(name, split, rebuild=args.action == "build")
            rows.append({"split": s.name, "n": int(s.x.shape[0]), "sha256": s.sha256, "ok": True})
    _print_json(rows)
    return 0


def cmd_quickstart(args) -> int:
    from zoo.quickstart import run

    run(Path(args.out), steps=args.steps)
    return 0


# ---------------------------------------------------------------- parser
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo", description="icl-zoo: in-context learning by gradient descent, as a model zoo")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="list registry entries")
    s.add_argument("filter", nargs="?", help="substring of the entry name")
    s.add_argument("--arch", help="architecture type, e.g. lsa")
    s.add_argument("--source", choices=["trained", "constructed"])
    s.add_argument("--task")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("show", help="print one entry and its task")
    s.add_argument("name")
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("build", help="construct or train an entry, evaluate it and save a checkpoint folder")
    s.add_argument("name")
    s.add_argument("--out", help="output folder (default checkpoints/NAME)")
    s.add_argument("--steps", type=int, help="override the recipe's training steps")
    s.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if available)")
    s.add_argument("--seed", type=int)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_build)

    s = sub.add_parser("eval", help="score a checkpoint (folder or Hub repo) on its frozen test split")
    s.add_argument("path", help="checkpoint folder or ORG/NAME")
    s.add_argument("--revision")
    s.add_argument("--dataset", help="Hub dataset repo ORG/NAME holding the frozen test split")
    s.add_argument("--dataset-revision")
    s.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("datasets", help="build or verify the frozen splits of the registry")
    s.add_argument("action", choices=["build", "verify"])
    s.add_argument("tasks", nargs="*", help="task names (default: all)")
    s.set_defaults(fn=cmd_datasets)

    s = sub.add_parser("quickstart", help="the zoo end to end on CPU in a few minutes")
    s.add_argument("--out", default="quickstart-out")
    s.add_argument("--steps", type=int, default=1500)
    s.set_defaults(fn=cmd_quickstart)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except KeyboardInterrupt as e:
        print(f"\n{e}" if str(e) else "\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        # Library errors are written to be read: show the message, not a traceback.
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
