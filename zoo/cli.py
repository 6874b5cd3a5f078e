"""The `zoo` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _print_json(obj) -> None:
    """Indented JSON with its unicode as it is (θ, η, ≤), or escaped where the output cannot encode it."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    try:
        text.encode(sys.stdout.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    print(text)


# ---------------------------------------------------------------- registry
LIST_COLUMNS = ("name", "arch", "source", "task", "reproduces")
WIDE = 130  # columns from which `zoo list` shows the paper column beside the others


def cmd_list(args) -> int:
    """A table on a terminal (grouped by task below WIDE columns, so it fits 80), plain TSV when the output is
    piped or redirected (one header line, then one entry a line), JSON with --json."""
    from zoo.science.registry import list_entries

    fields = {k: v for k, v in (("arch_type", args.arch), ("source", args.source), ("task", args.task)) if v}
    entries = list_entries(args.filter, **fields)
    if args.json:
        _print_json([{"name": e.name, "arch": e.arch.type, "source": e.source.kind, "task": e.task, "paper": e.paper} for e in entries])
        return 0
    from rich.console import Console

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
    from rich import box
    from rich.table import Table

    wide = console.width >= WIDE
    table = Table(title=f"icl-zoo: {len(entries)} entries", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=None if wide else "every column: zoo list --json, or piped (TSV)")
    table.add_column("name", no_wrap=True)
    table.add_column("arch", no_wrap=True)
    table.add_column("source", no_wrap=True)
    if wide:
        table.add_column("task", no_wrap=True)
        table.add_column("reproduces", no_wrap=True, overflow="ellipsis", max_width=60)
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
    from zoo.science.registry import get_entry, get_task_spec

    e = get_entry(args.name)
    _print_json({"entry": e.model_dump(mode="json"), "task": get_task_spec(e.task).model_dump(mode="json")})
    return 0


# ---------------------------------------------------------------- build / eval
TRACK_ALIGNMENT_HELP = ("record the prediction and sensitivity L2 errors and the sensitivity cosine to the entry's GD "
                        "reference on 2,000 validation tasks at every eval step, in the history and the card's plot "
                        "(blogpost Figure 10); the weights are unchanged")


def _training_process() -> None:
    """A command that trains flushes denormals before torch starts its threads (zoo/running/train.py)."""
    from zoo.running.train import flush_denormals_in_this_process

    flush_denormals_in_this_process()


def cmd_build(args) -> int:
    _training_process()
    import zoo

    out = Path(args.out or Path("checkpoints") / args.name)
    ckpt = zoo.build(args.name, out, steps=args.steps, device=args.device, seed=args.seed, progress=not args.quiet,
                     compiled=args.compile, track_alignment=args.track_alignment, force=args.force,
                     graphs=not args.no_graphs)
    print(f"built {args.name} → {out}")
    _print_json(ckpt.metrics)
    return 0


def _register_variant_task(ckpt) -> None:
    """A checkpoint trained on a task variant (a sweep's task.* override) carries its task spec."""
    from zoo.science.registry import default_registry

    return default_registry().tasks.setdefault(ckpt.entry.task, ckpt.task_spec)


def cmd_eval(args) -> int:
    if args.task or args.check or args.path.endswith(".onnx"):
        return cmd_benchmark(args)
    import zoo
    from zoo.science.evaluation import gd_reference, rescore
    from zoo.science.registry import default_registry
    from zoo.science.tasks.frozen import load_split, load_split_from_hub

    ckpt = zoo.load(args.path, revision=args.revision, endpoint=args.endpoint)
    task = ckpt.task
    registered = default_registry().tasks.get(ckpt.entry.task)  # before the checkpoint's own spec is added
    _register_variant_task(ckpt)
    if args.dataset and args.split != "test":
        raise ValueError("--dataset downloads the test split; score the validation split from the registry's seeds")
    checked_against = None
    if args.dataset:
        # The download is scored only against a hash, and for a task the registry knows it is the registry's:
        # a checkpoint's own claim would let a rigged checkpoint vouch for a rigged split.
        claim = ckpt.provenance.get("dataset_hashes", {}).get("test")
        pinned = registered.splits["test"].sha256 if registered is not None and "test" in registered.splits else None
        if pinned is not None:  # a task of the registry files (a variant registered in this process pins none)
            expected = pinned
            checked_against = "registry"
            if claim is not None and claim != expected:
                print(f"warning: the checkpoint claims {ckpt.entry.task}/test has SHA-256 {claim}, but the registry "
                      f"records {expected}; the download is checked against the registry's", file=sys.stderr)
        else:
            own = ckpt.task_spec.splits.get("test")
            expected = claim or (own.sha256 if own is not None else None)
            checked_against = (f"the checkpoint's own claim (the registry has no {ckpt.entry.task}/test; "
                               "not checked against the registry)")
        if expected is None:
            raise ValueError(f"--dataset {args.dataset}: neither the checkpoint nor the registry records the hash of "
                             f"{ckpt.entry.task}/test, so the download cannot be verified; refusing to score it")
        split = load_split_from_hub(args.dataset, split="test", revision=args.dataset_revision,
                                    expected_sha256=expected, endpoint=args.endpoint,
                                    spec=registered or ckpt.task_spec)
    else:
        split = load_split(ckpt.entry.task, args.split, spec=_register_variant_task(ckpt))  # hash-checked against the registry
    reference = gd_reference(ckpt.entry, task, ckpt.construction, recorded=ckpt.metrics)
    metrics = rescore(ckpt, split)
    metrics["dataset"] = split.name
    metrics["dataset_sha256"] = split.sha256
    if checked_against is not None:
        metrics["dataset_checked_against"] = checked_against
    if args.input_scales:
        from zoo.science.evaluation import input_scale_curve

        metrics["input_scale_curve"] = input_scale_curve(ckpt.model, task, args.input_scales, **reference)
    if args.plot and args.loops and args.gd_etas:
        raise ValueError("--plot draws one figure: give it with --loops or with --gd-etas, not both")
    if args.weights:
        from zoo.science.analysis.gd_ssm_kernels import compare_with_construction
        from zoo.science.analysis.plots import gd_ssm_kernel_figure

        result = compare_with_construction(ckpt.model, task, reference.get("eta"))
        gd_ssm_kernel_figure(result, args.weights, title=ckpt.entry.name)
        metrics["weights_vs_construction"] = {k: v for k, v in result.items() if k != "matrices"}
        print(f"wrote {args.weights}", file=sys.stderr)
    if args.gd_etas:
        from zoo.science.evaluation import gd_rate_curve

        metrics["gd_rate_curve"] = gd_rate_curve(ckpt.model, task, split.batch(task), args.gd_etas)
        if args.plot:
            from zoo.science.analysis.plots import gd_rate_figure

            gd_rate_figure(metrics["gd_rate_curve"], args.plot, title=ckpt.entry.name)
            print(f"wrote {args.plot}", file=sys.stderr)
    if args.loops:
        import torch

        from zoo.science.evaluation import loop_curve

        batch = split.batch(task, dtype=torch.float64)
        metrics["loop_curve"] = loop_curve(ckpt.model.double(), task, batch, args.loops, args.dampings,
                                           eta=reference.get("eta"), zero_x_updates=args.zero_x_updates)
        if args.plot:
            from zoo.science.analysis.plots import loop_curve_figure

            loop_curve_figure(metrics["loop_curve"], args.plot, title=ckpt.entry.name)
            print(f"wrote {args.plot}")
    if args.json:
        _print_json(metrics)
    else:
        width = max(map(len, metrics), default=0)
        for k, v in metrics.items():
            print(f"{k:>{width}}: {v}")
    return 0


CHECKPOINT_ONLY_FLAGS = ("dataset", "input_scales", "weights", "loops", "gd_etas", "plot")


def cmd_benchmark(args) -> int:
    """`zoo eval MODEL --task TASK`: any model on a frozen split with the card's metrics (zoo/publishing/benchmark.py);
    `zoo eval --check RECORD MODEL`: score it again and confirm or refute the record (exit 1 when refuted)."""
    from zoo.publishing import benchmark
    from zoo.storage.atomic import write_text

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
                                  endpoint=args.endpoint)
        print(verdict.message)
        return 0 if verdict.confirmed else 1
    if not args.task:
        raise ValueError(f"{args.path}: give the task whose frozen split to score it on, --task TASK "
                         "(`zoo show ENTRY` shows an entry's task)")
    record = benchmark.evaluate(args.path, task=args.task, split=args.split, revision=args.revision,
                                endpoint=args.endpoint)
    if args.out:  # only a scored model gets a record: a failure above leaves nothing behind
        write_text(args.out, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if args.json:
        _print_json(record)
    else:
        print("\n".join(benchmark.summary_lines(record)))
    return 0


def cmd_leaderboard(args) -> int:
    """Rank the released entries on a task, GD, least squares and `--add` models; print and draw the table."""
    from zoo.publishing.leaderboard import leaderboard, markdown_table, write

    add = {}
    for item in args.add:
        name, sep, model = item.partition("=")
        name = name.strip()
        if not (sep and name and model) or name in add:
            raise ValueError(f"--add {item!r}: expected NAME=MODEL with a new NAME (MODEL: an ONNX file, a Hub repo "
                             "holding one, or a checkpoint)")
        add[name] = model
    board = leaderboard(args.task, split=args.split, add=add, entries=args.only,
                        progress=None if args.quiet else lambda name: print(f"scoring {name}", file=sys.stderr))
    print(markdown_table(board), end="")
    for path in write(board, Path(args.out)):  # after every model is scored: a failure writes nothing
        print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_datasets(args) -> int:
    from zoo.science.registry import default_registry
    from zoo.science.tasks.frozen import load_split

    reg = default_registry()
    names = args.tasks or sorted(reg.tasks)
    rows = []
    for name in names:
        for split in reg.task(name).splits:
            s = load_split(name, split, spec=reg.task(name), rebuild=args.action == "build")
            rows.append({"split": s.name, "n": int(s.x.shape[0]), "sha256": s.sha256, "ok": True})
    _print_json(rows)
    return 0


# ---------------------------------------------------------------- hub
def _hub_kwargs(args) -> dict:
    return {"root": Path(args.root)} if args.hub == "local" and args.root else {}


def cmd_publish(args) -> int:
    import tempfile

    import zoo
    from zoo.publishing.hub import publish, validate_repo_id
    from zoo.storage.card import CARD_MARKER, write_card_and_figures
    from zoo.storage.checkpoint import read_checkpoint
    from zoo.storage.locate import locate

    validate_repo_id(args.repo)
    folder = Path(args.source)
    if not folder.is_dir():  # a registry entry: build it first
        folder = Path(args.out or Path("checkpoints") / args.source)
        zoo.build(args.source, folder, steps=args.steps, progress=not args.quiet)
    verified = locate(folder)  # every hash checked before anything leaves the machine
    ckpt = read_checkpoint(verified)
    with tempfile.TemporaryDirectory() as tmp:  # the source folder is never modified by publishing
        staged = Path(tmp) / folder.name
        staged.mkdir()
        # Only the checkpoint's own files, from the bytes that were hashed: config.json, what it lists,
        # and the card with its figures. Anything else in the folder stays on this machine.
        for name, raw in verified.data.items():
            (staged / name).write_bytes(raw)
        left = sorted(p.name for p in folder.iterdir() if p.name not in verified.data and p.name != "README.md"
                      and p.suffix != ".png" and p.name != ".train")
        if left:
            print(f"not published (not part of the checkpoint): {', '.join(left)}")
        readme = folder / "README.md"
        if readme.is_file() and not readme.is_symlink() and CARD_MARKER not in readme.read_text(errors="replace"):
            print(f"keeping the hand-written {readme} (it is not a generated card)")
            (staged / "README.md").write_bytes(readme.read_bytes())
        else:
            write_card_and_figures(ckpt, staged, repo_id=args.repo, dataset_repo=args.dataset_repo,
                                   dataset_revision=args.dataset_revision)
        sha = publish(staged, args.repo, hub=args.hub, repo_type="model", **_hub_kwargs(args))
    print(f"published {folder} → {args.repo} ({args.hub}) revision {sha}  ({ckpt.trust})")
    return 0


def cmd_publish_dataset(args) -> int:
    import tempfile

    from zoo.publishing.hub import dataset_folder, publish, validate_repo_id

    validate_repo_id(args.repo)
    with tempfile.TemporaryDirectory() as tmp:
        folder, hashes = dataset_folder(args.task, Path(tmp), repo=args.repo, revision="main")  # the card loads this repo
        sha = publish(folder, args.repo, hub=args.hub, repo_type="dataset", **_hub_kwargs(args))
    print(f"published frozen splits of {args.task} → {args.repo} ({args.hub}) revision {sha}")
    _print_json(hashes)
    return 0


def cmd_hub_serve(args) -> int:
    import signal
    import time

    from zoo.publishing.hub import default_local_hub, start_server, stop_server

    def interrupted(signum, frame):  # SIGTERM as Ctrl-C: the server and its temp folder go down with us
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    root = (Path(args.dir) if args.dir else default_local_hub()).resolve()  # the server serves an absolute root
    proc = None
    try:
        if args.port:  # a busy port is refused before the (longer) import
            from zoo.publishing.hub import check_port_free

            check_port_free(args.port)
        if not args.no_release:
            from zoo.publishing.hub_prepare import prepare

            prepare(root)  # once per release (progress shown); reused while the release is unchanged
        proc, endpoint = start_server(root, args.port)
        print(f"serving the local hub {root} at {endpoint}", flush=True)
        print(f"  export HF_ENDPOINT={endpoint}    # then huggingface_hub / datasets / zoo use it", flush=True)
        while proc.poll() is None:
            time.sleep(0.5)
        print(f"error: the hub server exited with code {proc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None:
            stop_server(proc)


def cmd_pull(args) -> int:
    from zoo.storage.checkpoint import read_checkpoint
    from zoo.storage.locate import locate, validate_repo_id

    verified = locate(validate_repo_id(args.repo), revision=args.revision, endpoint=args.endpoint)
    ckpt = read_checkpoint(verified)
    print(f"{args.repo}@{args.revision or 'main'} → {verified.folder}  ({ckpt.entry.name}, {ckpt.trust})")
    return 0


# ---------------------------------------------------------------- export / stream
def cmd_export(args) -> int:
    import zoo
    from zoo.running.builder import claim_out, save
    from zoo.storage.save import not_zoo_file

    ckpt = zoo.load(args.path, revision=args.revision, endpoint=args.endpoint)
    local = Path(args.path).is_dir()
    out = Path(args.out) if args.out else (Path(args.path) if local else Path("exported") / ckpt.entry.name)
    # Another run's checkpoint in --out is replaced only with --force, and then entirely; in place, the
    # folder holds this very checkpoint.
    in_place = local and out.resolve() == Path(args.path).resolve()
    replacing = not in_place and claim_out(out, ckpt.entry, ckpt.task_spec, seed=ckpt.provenance.get("seed"),
                                           force=args.force)
    # weights, ONNX graphs, hashes in config.json, card: staged beside `out` and swapped in whole
    save(ckpt, out, keep=(lambda n: False) if replacing else not_zoo_file)
    written = sorted(p.name for p in out.glob("*.onnx"))
    print(f"exported {ckpt.entry.name} → {out}: {', '.join(written)}")
    return 0


def cmd_stream(args) -> int:
    """Stream tokens through the step graph in constant memory: a .npy file chunk by chunk, text
    (CSV rows or JSON lists, a file or stdin) line by line, each output written as its token arrives.
    The input (and --state-in) is checked before anything is written; --output and --state-out
    files are written beside their targets and renamed onto them only when the stream ends well."""
    import os
    from contextlib import ExitStack

    import numpy as np

    from export.streaming import StreamingSession
    from export.token_io import (
        OutputWriter,
        PendingFile,
        is_array_file,
        iter_array_chunks,
        iter_lines,
        open_text,
        signals_unwind,
    )

    def same(a: str, b: str) -> bool:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        try:
            return os.path.samefile(a, b)
        except OSError:  # one of them does not exist (yet)
            return False

    if args.input != "-":
        for flag, target in (("--output", args.output), ("--state-out", args.state_out)):
            if target and same(target, args.input):
                raise ValueError(f"{flag} {target} is the input file; writing it would destroy the tokens being read")
    if args.output and args.state_out and same(args.output, args.state_out):
        raise ValueError(f"--output and --state-out are the same file {args.output}")
    import warnings

    with warnings.catch_warnings():  # said once, below, in the CLI's words
        warnings.simplefilter("ignore")
        session = StreamingSession(args.path, revision=args.revision, endpoint=args.endpoint,
                                   threads=getattr(args, "threads", None))
    select = (lambda out: out) if args.raw else session.predict
    width = session.d_out if args.raw else session.readout["stop"] - session.readout["start"]
    with ExitStack() as stack:
        if is_array_file(args.input):  # shape, dtype and d_in checked from the header; the data memory-mapped
            (batch, length, _), chunks = iter_array_chunks(args.input, d_in=session.d_in, nan=args.nan)
            session.reset(batch)
            _restore_state(session, args.state_in)
            shape = (batch, length, width)
        else:
            lines = stack.enter_context(open_text(args.input))
            session.reset(1)
            _restore_state(session, args.state_in)
            chunks, shape = None, None
        stack.enter_context(signals_unwind())  # SIGTERM / SIGHUP unwind through the cleanup below
        writer = OutputWriter(args.output, shape)
        state_file = None
        try:
            state_file = PendingFile(args.state_out) if args.state_out else None
            if state_file and state_file.direct:
                raise ValueError(f"--state-out {args.state_out}: not a regular file; the state is an .npz file")
            if chunks is not None:
                for chunk in chunks:
                    writer.write(select(session.push(chunk)))
            else:
                for _, token in iter_lines(lines, args.input, d_in=session.d_in, nan=args.nan):
                    writer.write(select(session.push(token[None, None])), flush=True)
            if state_file:
                with open(state_file.path, "wb") as f:  # exactly this name (np.savez would append .npz to a path)
                    np.savez(f, **session.state)
            writer.close()
            if state_file:
                state_file.commit()
        except BaseException:  # an error, Ctrl-C or SIGTERM: no partial file, an existing one untouched
            writer.abort()
            if state_file:
                state_file.discard()
            raise
    if args.state_out:
        print(f"state after {session.steps} tokens → {args.state_out} (resume with --state-in)", file=sys.stderr)
    if not args.quiet:  # what the graphs were checked against: the release, their config.json, or nothing
        print(f"{session.path}: {session.trust}", file=sys.stderr)
    return 0


def _restore_state(session, path: str | None) -> None:
    """Start from a state saved by --state-out, its names and shapes checked against the graph's
    (for the session's batch) from the file's headers before any array is read; never unpickled."""
    if path:
        from export.token_io import read_state

        session.set_state(read_state(path, session.state_shapes(session.batch)))


def cmd_release(args) -> int:
    from zoo.publishing import release
    from zoo.storage import locate

    root = Path(args.root) if args.root else locate.release_dir()
    if args.release_command == "build":
        _training_process()
        started = __import__("time").perf_counter()
        index = release.build_release(root, only=args.only, time_budget=args.time_budget, device=args.device,
                                      workers=args.workers, threads=args.threads, force=args.force,
                                      compiled=not args.no_compile)
        print(f"release {index['version']}: {len(index['entries'])} entries in {root} "
              f"({__import__('time').perf_counter() - started:.0f} s); index: {root / locate.INDEX_MD}")
        if args.archive:
            path = release.write_archive(root, Path(args.archive))
            print(f"archive {path}: {path.stat().st_size / 2**20:.2f} MiB (on another machine: zoo release unpack --adopt-index {path})")
    elif args.release_command == "refresh":
        index = release.refresh_release(root, only=args.only, graphs=args.graphs)
        print(f"re-rendered cards and index of {len(index['entries'])} released entries in {root}")
        if args.leaderboards:
            from zoo.publishing.leaderboard import write_leaderboards

            written = write_leaderboards(root)
            print(f"wrote {len(written)} leaderboard files in {root / 'leaderboards'}")
    elif args.release_command == "plan":
        release.print_plan(device=args.device, only=args.only, threads=args.threads, compiled=not args.no_compile)
    elif args.release_command == "archive":
        path = release.write_archive(root, Path(args.out))
        print(f"archive {path}: {path.stat().st_size / 2**20:.2f} MiB")
    elif args.release_command == "unpack":
        release.unpack_archive(Path(args.archive), root, adopt_index=args.adopt_index)
        if args.adopt_index:
            print(f"unpacked {args.archive} into {root}: ITS index.json IS NOW THE TRUST ROOT there (every file "
                  "hash-verified against the archive's own index, not against the index shipped before)")
        else:
            print(f"unpacked {args.archive} into {root} (every file hash-verified against the shipped index "
                  f"{locate.release_dir() / locate.INDEX_JSON})")
    elif args.release_command == "publish":
        out = release.publish_release(args.org, hub=args.hub, root=root, datasets=not args.no_datasets)
        print(f"published {len(out['repos'])} repos at tag {out['version']}; collection {out['collection']}")
    return 0


def cmd_quickstart(args) -> int:
    from zoo.publishing.quickstart import run, run_release

    if args.from_scratch:
        run(Path(args.out), steps=args.steps)
    else:
        run_release(Path(args.out))
    return 0


# ---------------------------------------------------------------- parser
def _parse_value(text: str):
    """A --set value: JSON when it parses (numbers, true/false, lists), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_sweep(args) -> int:
    _training_process()
    from zoo.running.sweep import load_spec, markdown_table, run_sweep

    spec = load_spec(args.spec)
    update = {"steps": args.steps} if args.steps else {}
    if args.ensemble:
        update["ensemble"] = True
    if args.compile:
        update["compiled"] = True
    if args.track_alignment:
        update["track_alignment"] = True
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
            grid[field] = [_parse_value(value)]
        update["grid"] = grid
    spec = spec.model_copy(update=update)
    rows = run_sweep(spec, args.out, backend=args.backend, address=args.address, gpus_per_run=args.gpus_per_run,
                     progress=not args.quiet)
    print(markdown_table(rows), end="")
    return 0


def cmd_report(args) -> int:
    from zoo.publishing.report import collect, write_report

    rows = collect(args.paths, input_scales=args.input_scales, weights=args.weights)
    for path in write_report(rows, Path(args.out)):
        print(f"wrote {path}")
    print((Path(args.out) / "report.md").read_text())
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo", description="icl-zoo: in-context learning by gradient descent, as a model zoo")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")
    from zoo.version import __version__

    p.add_argument("--version", action="version", version=f"icl-zoo {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="list registry entries")
    s.add_argument("filter", nargs="?", help="substring of the entry name")
    s.add_argument("--arch", help="architecture type, e.g. lsa")
    s.add_argument("--source", choices=["trained", "constructed"])
    s.add_argument("--task")
    s.add_argument("--json", action="store_true", help="a JSON list (name, arch, source, task, paper)")
    s.add_argument("--tsv", action="store_true", help="tab-separated values with a header (the default when piped)")
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
    s.add_argument("--compile", action="store_true",
                   help="train through torch.compile: ~10–60 s to compile, then up to 2.5–6× the steps/s on a CPU for "
                        "scan-heavy and small models, ~1× for LSTM/GRU (benchmarks/train_throughput.py); "
                        "same data and losses to rounding")
    s.add_argument("--track-alignment", action="store_true", help=TRACK_ALIGNMENT_HELP)
    s.add_argument("--no-graphs", action="store_true",
                   help="write no ONNX graphs (most of a short run's time); `zoo export OUT` adds them later")
    s.add_argument("--force", action="store_true",
                   help="replace an --out folder that holds another entry's (or run's) checkpoint, entirely")
    s.set_defaults(fn=cmd_build)

    s = sub.add_parser("eval", help="score a checkpoint (folder or Hub repo), or with --task any model, on a frozen split")
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
    s.add_argument("--json", action="store_true")
    s.add_argument("--task", help="score any model — an ONNX file, a Hub repo holding one, a checkpoint — on this task's "
                                  "frozen split, beside GD and least squares (the open benchmark, zoo/publishing/benchmark.py)")
    s.add_argument("--check", metavar="RECORD", help="score the model again as RECORD (a --json/--out record) says, "
                                                     "and confirm or refute it (exit 1 when refuted)")
    s.add_argument("--out", metavar="JSON", help="with --task: also write the record here (only if scoring succeeds)")
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("leaderboard", help="rank the released entries on a task beside GD, least squares and your models")
    s.add_argument("task")
    s.add_argument("--add", action="append", default=[], metavar="NAME=MODEL",
                   help="also score MODEL (an ONNX file, a Hub repo holding one, a checkpoint) as NAME (repeatable)")
    s.add_argument("--only", nargs="+", metavar="ENTRY", help="of the released entries, rank only these")
    s.add_argument("--split", choices=["test", "validation"], default="test")
    s.add_argument("--out", default="leaderboards", help="folder for TASK.md and TASK.png (default: leaderboards)")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_leaderboard)

    s = sub.add_parser("datasets", help="build or verify the frozen splits of the registry")
    s.add_argument("action", choices=["build", "verify"])
    s.add_argument("tasks", nargs="*", help="task names (default: all)")
    s.set_defaults(fn=cmd_datasets)

    s = sub.add_parser("publish", help="publish a checkpoint folder (or build an entry) as a Hub model repo")
    s.add_argument("source", help="checkpoint folder or registry entry name")
    s.add_argument("--repo", required=True, help="ORG/NAME")
    s.add_argument("--hub", default="local", help="'local' (default), 'hf' for huggingface.co, or a Hub URL")
    s.add_argument("--root", help="local hub directory (default: ~/.cache/icl-zoo/publishing/hub or ICL_ZOO_LOCAL_HUB)")
    s.add_argument("--dataset-repo", help="dataset repo holding the frozen splits (pinned in the card)")
    s.add_argument("--dataset-revision", help="its revision (commit sha)")
    s.add_argument("--out", help="where to build an entry given by name")
    s.add_argument("--steps", type=int)
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_publish)

    s = sub.add_parser("publish-dataset", help="publish a task's frozen splits as a Hub dataset repo")
    s.add_argument("task")
    s.add_argument("--repo", required=True, help="ORG/NAME")
    s.add_argument("--hub", default="local")
    s.add_argument("--root")
    s.set_defaults(fn=cmd_publish_dataset)

    s = sub.add_parser("pull", help="download a model repo through huggingface_hub and verify it")
    s.add_argument("repo")
    s.add_argument("--revision")
    s.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    s.set_defaults(fn=cmd_pull)

    s = sub.add_parser("hub", help="local hub tools")
    hub_sub = s.add_subparsers(dest="hub_command", required=True)
    s = hub_sub.add_parser("serve", help="serve the local hub (a read-only Hugging Face Hub) on 127.0.0.1")
    s.add_argument("--dir", help="local hub directory")
    s.add_argument("--port", type=int, help="default: a free port")
    s.set_defaults(fn=cmd_hub_serve)

    s.add_argument("--no-release", action="store_true", help="serve the hub as it is, without importing the shipped release")

    s = sub.add_parser("release", help="the zoo's release: every entry's checkpoint, built, indexed, shipped and served")
    rel_sub = s.add_subparsers(dest="release_command", required=True)
    s = rel_sub.add_parser("build", help="build every entry (or --only …) into release/; resumable entry by entry")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="per trained entry: train at most this long (steps chosen from measured throughput, "
                        "recorded as steps run / recipe steps); default: the recipe's length")
    s.add_argument("--device", help="cpu, cuda … (default: cuda if available)")
    s.add_argument("--workers", type=int, default=1, help="entries built at once in separate processes")
    s.add_argument("--threads", type=int, help="torch threads per worker (1 on a CPU with --workers = cores)")
    s.add_argument("--force", action="store_true", help="rebuild entries that are already current")
    s.add_argument("--no-compile", action="store_true", help="train eagerly (default: through torch.compile, "
                   "except entries that run as CUDA-graph ensembles)")
    s.add_argument("--archive", metavar="TAR_GZ", help="also write the release as one archive")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_release)
    s = rel_sub.add_parser("refresh", help="re-render the cards and the index of released entries (no retraining)")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--root")
    s.add_argument("--graphs", action="store_true", help="also re-export the ONNX graphs from the released weights")
    s.add_argument("--leaderboards", action="store_true",
                   help="also re-score every released entry for release/leaderboards/ (a few minutes on a CPU)")
    s.set_defaults(fn=cmd_release)
    s = rel_sub.add_parser("plan", help="each trained entry's cost at its recipe length, from measured throughput here")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--device")
    s.add_argument("--threads", type=int)
    s.add_argument("--no-compile", action="store_true", help="measure eager training only (no compiled column)")
    s.add_argument("--root")
    s.set_defaults(fn=cmd_release)
    s = rel_sub.add_parser("archive", help="write the release as one .tar.gz")
    s.add_argument("out")
    s.add_argument("--root")
    s.set_defaults(fn=cmd_release)
    s = rel_sub.add_parser("unpack", help="unpack a release archive into release/ (hash-verified against the "
                           "shipped index)")
    s.add_argument("archive")
    s.add_argument("--adopt-index", action="store_true",
                   help="a NEW release built elsewhere: verify against the archive's own index, which becomes the "
                        "trust root (default: every entry must match the shipped release/index.json)")
    s.add_argument("--root")
    s.set_defaults(fn=cmd_release)
    s = rel_sub.add_parser("publish", help="push every released repo and dataset to a Hub, tagged, in a Collection")
    s.add_argument("--org", required=True)
    s.add_argument("--hub", default="hf", help="'hf' for huggingface.co, or a Hub URL")
    s.add_argument("--no-datasets", action="store_true")
    s.add_argument("--root")
    s.set_defaults(fn=cmd_release)

    s = sub.add_parser("export", help="write model_step.onnx / model.onnx for a checkpoint (folder or repo)")
    s.add_argument("path")
    s.add_argument("--out", help="output folder (default: the checkpoint folder itself)")
    s.add_argument("--revision")
    s.add_argument("--endpoint")
    s.add_argument("--force", action="store_true",
                   help="replace an --out folder that holds another entry's (or run's) checkpoint, entirely")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("stream", help="stream tokens through the ONNX step graph with constant memory")
    s.add_argument("path", help="checkpoint folder, model_step.onnx or ORG/NAME")
    s.add_argument("--input", required=True, help="tokens: .npy (T,d) or (B,T,d), .csv (one token per row), JSON lines, or - for stdin")
    s.add_argument("--output", help=".npy or .csv (default: CSV on stdout)")
    s.add_argument("--raw", action="store_true", help="write the full outputs instead of the task read-out")
    s.add_argument("--nan", choices=["refuse", "pass"], default="refuse",
                   help="non-finite tokens: refuse (default, an error naming the line) or pass them to the model")
    s.add_argument("--state-in", metavar="NPZ", help="start from a saved state (names as the graph's state_in.*)")
    s.add_argument("--state-out", metavar="NPZ", help="save the state after the last token (resume with --state-in)")
    s.add_argument("--revision")
    s.add_argument("--endpoint")
    s.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: its own choice)")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_stream)

    s = sub.add_parser("sweep", help="run a sweep spec (entries × seeds × overrides) and write one results table")
    s.add_argument("spec", help="sweep TOML (see zoo/running/sweep.py and sweeps/)")
    s.add_argument("--backend", choices=["local", "ray"], default="local")
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

    s = sub.add_parser("report", help="compare checkpoints (or sweep folders) with GD and least squares")
    s.add_argument("paths", nargs="+", help="checkpoint folders, folders holding them, or a report's results.json "
                                            "(regenerates its tables and figures)")
    s.add_argument("--out", default="report", help="folder for report.md and report.png")
    s.add_argument("--input-scales", type=float, nargs="+", metavar="ALPHA",
                   help="also score each checkpoint on inputs scaled by ALPHA, beside GD (Sushma, Tian et al. Figs. 1D/2D)")
    s.add_argument("--weights", action="store_true",
                   help="one-layer GD-SSMs: compare each with the construction up to the weights' symmetries (Fig. 3)")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("quickstart", help="pull a released model from a served hub, stream it with ONNX, re-score it")
    s.add_argument("--out", default="quickstart-out")
    s.add_argument("--from-scratch", action="store_true",
                   help="the second demo: construct θ_GD, train an LSA on CPU, publish and pull it back")
    s.add_argument("--steps", type=int, default=1500, help="with --from-scratch: training steps")
    s.set_defaults(fn=cmd_quickstart)
    return p


TARGET_ARGS = ("path", "repo", "source", "model")  # the arguments that name a folder or a Hub repo


def _looks_like_folder(text: str) -> bool:
    """A path a person typed (./x, ../x, /x, ~/x, a/b/c, x\\y, or under a folder that exists here), not ORG/NAME."""
    path = Path(text).expanduser()
    return (text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
            or (path.parent != Path(".") and path.parent.is_dir()))


def _hub_failure(e: BaseException) -> str | None:
    """What a huggingface_hub error means to a person: 'not found' or 'cannot reach'; None for other errors."""
    for err in (e, e.__cause__, e.__context__):
        if err is None:
            continue
        module, name = type(err).__module__, type(err).__name__
        if module.startswith("huggingface_hub") or name in ("ConnectError", "ConnectionError"):
            text = str(err)
            if name == "LocalEntryNotFoundError" or "ConnectError" in text or "Name or service" in text or "Connection refused" in text:
                return "cannot reach the hub"
            if name == "RevisionNotFoundError":
                return "no such revision"
            return "not found"
    return None


def _explain_missing(args, e: BaseException) -> str | None:
    """A folder or repo the command could not find, said in a person's terms: "no such folder" for a path
    that does not exist (never a Hub error about it), and for a repo id the hub does not hold, the released
    entries it is close to (a 401 from a hub means "no such repo" for a reader without a token)."""
    import difflib

    target = next((v for k in TARGET_ARGS if isinstance(v := getattr(args, k, None), str)), None)
    if target is None or Path(target).expanduser().exists():
        return None
    failure = _hub_failure(e)
    invalid_id = isinstance(e, ValueError) and "invalid repo id" in str(e)
    if failure is None and not invalid_id:
        return None
    if invalid_id or _looks_like_folder(target):
        return f"no such folder: {target}"
    endpoint = getattr(args, "endpoint", None)
    if not endpoint:  # what huggingface_hub asked: HF_ENDPOINT as it was when huggingface_hub was imported
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    revision = getattr(args, "revision", None)
    what = f"{target}@{revision}" if revision else target
    try:
        from zoo.storage.locate import ORG, read_index

        released = [f"{ORG}/{n}" for n in read_index()["entries"]]
    except Exception:  # no shipped index: no suggestions, the message stands without them
        released = []
    near = difflib.get_close_matches(target, released, n=4, cutoff=0.6)
    for name in difflib.get_close_matches(target.split("/")[-1], [r.split("/", 1)[1] for r in released], n=4, cutoff=0.6):
        if f"{ORG}/{name}" not in near:  # the name part alone: a mistyped org, or a bare name with a slash
            near.append(f"{ORG}/{name}")
    if failure == "cannot reach the hub":
        message = f"{what}: no such folder here, and the hub {endpoint} cannot be reached to look for a repo of that name"
    elif failure == "no such revision":
        message = f"{target} has no revision {revision!r} on {endpoint}"
    else:
        message = f"{what}: no such folder here, and no such repo on {endpoint}"
    if near:
        message += f"; did you mean {', '.join(near[:4])}? (released entries; a bare entry name loads the shipped release)"
    else:
        message += "; `zoo list` shows the released entries (a bare entry name loads the shipped release)"
    return message


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except BrokenPipeError:  # the reader went away (`zoo stream … | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        print(f"\n{e}" if str(e) else "\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:
        # Library errors are written to be read: one line, not a traceback (--debug shows it). Anything
        # else that escapes (a library's own exception type on a hostile file) is named by its type.
        if args.debug:
            raise
        explained = _explain_missing(args, e)
        if explained:
            print(f"error: {explained}", file=sys.stderr)
            return 2
        known = isinstance(e, (ValueError, KeyError, OSError, RuntimeError))
        message = " ".join(str(e).split()) if not known else str(e)
        print(f"error: {message}" if known else f"error: {type(e).__name__}: {message[:500]} (--debug for the traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
