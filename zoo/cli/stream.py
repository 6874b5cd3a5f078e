"""`zoo export` and `zoo stream`: a checkpoint's ONNX graphs, and tokens streamed through its step graph."""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import ExitStack
from pathlib import Path

import zoo
from zoo.cli.output import add_command


def cmd_export(args) -> int:
    # deferred: these import torch
    from zoo.running.builder import claim_out, save
    from zoo.storage.atomic import recover_folder, writing
    from zoo.storage.save import not_zoo_file

    recover_folder(args.path)  # a checkpoint that a killed save left renamed aside is read where it was
    ckpt = zoo.load(args.path, revision=args.revision, endpoint=args.endpoint)
    local = Path(args.path).is_dir()
    out = Path(args.out) if args.out else (Path(args.path) if local else Path("exported") / ckpt.entry.name)
    with writing(out, what="zoo export"):  # no other writer between the check of --out and the save
        # Another run's checkpoint in --out is replaced only with --force, and then entirely; a folder that
        # is not a zoo checkpoint never is; in place, the folder holds this very checkpoint.
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
    # deferred: imports onnxruntime and numpy
    from export.streaming import StreamingSession
    from export.token_io import (
        is_array_file,
        iter_array_chunks,
        iter_lines,
        open_text,
        signals_unwind,
    )
    from zoo.storage.atomic import recover_folder

    check_targets(args)
    recover_folder(args.path)  # a checkpoint that a killed save left renamed aside is read where it was
    with warnings.catch_warnings():  # said once, below, in the CLI's words
        warnings.simplefilter("ignore")
        session = StreamingSession(args.path, revision=args.revision, endpoint=args.endpoint, threads=args.threads)
    width = session.d_out if args.raw else session.readout["stop"] - session.readout["start"]
    with ExitStack() as stack:
        if is_array_file(args.input):  # shape, dtype and d_in checked from the header; the data memory-mapped
            (batch, length, _), chunks = iter_array_chunks(args.input, d_in=session.d_in, nan=args.nan)
            shape = (batch, length, width)
            inputs = ((chunk, False) for chunk in chunks)
        else:  # one token a line, each answered (flushed) as it arrives
            lines = stack.enter_context(open_text(args.input))
            batch, shape = 1, None
            inputs = ((token[None, None], True) for _, token in iter_lines(lines, args.input, d_in=session.d_in,
                                                                           nan=args.nan))
        session.reset(batch)
        restore_state(session, args.state_in, nan=args.nan)
        stack.enter_context(signals_unwind())  # SIGTERM / SIGHUP unwind through the cleanup in write_stream
        write_stream(args, session, inputs, shape)
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    if args.state_out:
        print(f"state after {session.steps} tokens → {args.state_out} (resume with --state-in)", file=sys.stderr)
    if not args.quiet:  # what the graphs were checked against: the release, their config.json, or nothing
        print(f"{session.path}: {session.trust}", file=sys.stderr)
    return 0


def check_targets(args) -> None:
    """--output and --state-out are neither the input nor each other."""

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


def write_stream(args, session, inputs, shape) -> None:
    """Push each (tokens, flush) of `inputs` and write its outputs (the task read-out, or all with --raw);
    then the state. On an error, Ctrl-C or SIGTERM: no partial file, an existing one untouched."""
    # deferred: imports numpy
    import numpy as np

    from export.token_io import OutputWriter, PendingFile, write_error

    select = (lambda out: out) if args.raw else session.predict
    writer = OutputWriter(args.output, shape)
    state_file = None
    try:
        state_file = PendingFile(args.state_out) if args.state_out else None
        if state_file and state_file.direct:
            raise ValueError(f"--state-out {args.state_out}: not a regular file; the state is an .npz file")
        for tokens, flush in inputs:
            writer.write(select(session.push(tokens)), flush=flush)
        if state_file:
            try:
                with open(state_file.path, "wb") as f:  # exactly this name (np.savez would append .npz to a path)
                    np.savez(f, **session.state)
            except OSError as e:  # a full disk: one line naming the file
                raise write_error(args.state_out, e) from None
        writer.close()
        if state_file:
            state_file.commit()
    except BaseException:
        writer.abort()
        if state_file:
            state_file.discard()
        raise


def restore_state(session, path: str | None, *, nan: str = "refuse") -> None:
    """Start from a state saved by --state-out, its names and shapes checked against the graph's
    (for the session's batch) from the file's headers before any array is read; never unpickled.
    Non-finite values are refused unless `nan="pass"` (--nan pass), as non-finite tokens are."""
    if path:
        # deferred: imports numpy
        from export.token_io import read_state

        session.set_state(read_state(path, session.state_shapes(session.batch), nan=nan))


def register(sub) -> None:
    s = add_command(sub, "export", "write model_step.onnx / model.onnx for a checkpoint (folder or repo)",
                    "zoo export ckpt/quick", "zoo export icl-zoo/lsa-d10-c10 --out exported/lsa")
    s.add_argument("path", help="checkpoint folder, ORG/NAME, or a registry entry name (the shipped release)")
    s.add_argument("--out", help="output folder (default: the checkpoint folder itself)")
    s.add_argument("--revision")
    s.add_argument("--endpoint")
    s.add_argument("--force", action="store_true",
                   help="replace an --out folder that holds another entry's (or run's) checkpoint, entirely")
    s.set_defaults(fn=cmd_export)

    s = add_command(sub, "stream", "stream tokens through the ONNX step graph with constant memory",
                    "zoo stream gated-rnn-zucchet-icl --input tokens.npy --output out.npy",
                    "cat tokens.jsonl | zoo stream ckpt/gru --input - --state-out state.npz")
    s.add_argument("path", help="checkpoint folder, model_step.onnx or ORG/NAME")
    s.add_argument("--input", required=True, help="tokens: .npy (T,d) or (B,T,d), .csv (one token per row), JSON lines, or - for stdin")
    s.add_argument("--output", help=".npy or .csv (default: CSV on stdout)")
    s.add_argument("--raw", action="store_true", help="write the full outputs instead of the task read-out")
    s.add_argument("--nan", choices=["refuse", "pass"], default="refuse",
                   help="non-finite tokens or --state-in values: refuse (default, an error naming the line or the "
                        "array) or pass them to the model")
    s.add_argument("--state-in", metavar="NPZ", help="start from a saved state (names as the graph's state_in.*)")
    s.add_argument("--state-out", metavar="NPZ", help="save the state after the last token (resume with --state-in)")
    s.add_argument("--revision")
    s.add_argument("--endpoint")
    s.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: its own choice)")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_stream)
