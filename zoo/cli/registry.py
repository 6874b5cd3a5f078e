"""`zoo list`, `zoo show`, `zoo datasets`: the registry's entries, tasks and frozen splits."""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.table import Table

from zoo.cli.output import add_command, print_json
from zoo.science.paths import cache_dir

LIST_COLUMNS = ("name", "arch", "source", "task", "paper")  # the paper and figure an entry is for; not a verdict
WIDE = 130  # columns from which `zoo list` shows the paper column beside the others


def cmd_list(args) -> int:
    """A table on a terminal (grouped by task below WIDE columns, so it fits 80), plain TSV when the output is
    piped or redirected (one header line, then one entry a line), JSON with --json."""
    # deferred: imports torch
    from zoo.science.registry import list_entries

    fields = {k: v for k, v in (("arch_type", args.arch), ("source", args.source), ("task", args.task)) if v}
    entries = list_entries(args.filter, **fields)
    if args.json:
        print_json([{"name": e.name, "arch": e.arch.type, "source": e.source.kind, "task": e.task, "paper": e.paper}
                    for e in entries])
        return 0
    console = Console()
    if args.tsv or not console.is_terminal:
        print("\t".join(LIST_COLUMNS))
        for e in entries:
            print("\t".join(" ".join(str(v).split()) for v in (e.name, e.arch.type, e.source.kind, e.task, e.paper)))
        return 0
    list_table(entries, console)
    return 0


def list_table(entries, console) -> None:
    """`zoo list` on a terminal of `console.width` columns: every name whole; the paper column only where
    it fits, and below WIDE columns one section per task (the task's name as its heading)."""
    wide = console.width >= WIDE
    table = Table(title=f"icl-zoo: {len(entries)} entries", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=None if wide else "every column: zoo list --json, or piped (TSV)")
    table.add_column("name", no_wrap=True)
    table.add_column("arch", no_wrap=True)
    table.add_column("source", no_wrap=True)
    if wide:
        table.add_column("task", no_wrap=True)
        table.add_column("paper", no_wrap=True, overflow="ellipsis", max_width=60)
        for e in entries:
            table.add_row(e.name, e.arch.type, e.source.kind, e.task, e.paper)
    else:
        by_task: dict[str, list] = {}
        for e in entries:
            by_task.setdefault(e.task, []).append(e)
        for task, group in by_task.items():
            table.add_row(f"[bold]task {task}[/]", "", "")
            for e in group:
                table.add_row(f"  {e.name}", e.arch.type, e.source.kind)
            table.add_section()
    console.print(table)


def cmd_show(args) -> int:
    # deferred: imports torch
    from zoo.science.registry import get_entry, get_task_spec

    e = get_entry(args.name)
    print_json({"entry": e.model_dump(mode="json"), "task": get_task_spec(e.task).model_dump(mode="json")})
    return 0


def cmd_datasets(args) -> int:
    # deferred: these import torch
    from zoo.science.registry import default_registry
    from zoo.science.tasks.frozen import load_split

    reg = default_registry()
    rows = []
    for name in args.tasks or sorted(reg.tasks):
        for split in reg.task(name).splits:
            s = load_split(name, split, spec=reg.task(name), rebuild=args.action == "build")
            rows.append({"split": s.name, "n": int(s.x.shape[0]), "sha256": s.sha256, "ok": True})
    print_json(rows)
    # where a split is built (on first use, or rebuilt here): stderr, so that stdout stays the JSON alone
    print(f"frozen splits in {cache_dir() / 'datasets'}", file=sys.stderr)
    return 0


def register(sub) -> None:
    s = add_command(sub, "list", "list registry entries",
                    "zoo list gd --source constructed", "zoo list --arch lsa --json")
    s.add_argument("filter", nargs="?", help="substring of the entry name")
    s.add_argument("--arch", help="architecture type, e.g. lsa")
    s.add_argument("--source", choices=["trained", "constructed"])
    s.add_argument("--task")
    s.add_argument("--json", action="store_true", help="a JSON list (name, arch, source, task, paper)")
    s.add_argument("--tsv", action="store_true", help="tab-separated values with a header (the default when piped)")
    s.set_defaults(fn=cmd_list)

    s = add_command(sub, "show", "print one entry and its task (JSON)", "zoo show lsa-gd-zucchet-icl")
    s.add_argument("name", help="registry entry name (`zoo list` shows them)")
    s.set_defaults(fn=cmd_show)

    s = add_command(sub, "datasets", "build or hash-check the frozen splits of the registry",
                    "zoo datasets verify", "zoo datasets build zucchet-icl")
    s.add_argument("action", choices=["build", "verify"],
                   help="build: regenerate each split from its seed; verify: load each (built on first use) and check its hash")
    s.add_argument("tasks", nargs="*", help="task names (default: all)")
    s.set_defaults(fn=cmd_datasets)
