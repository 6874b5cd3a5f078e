"""The `zoo` command line: one module per command group, each declaring its commands (`register`) and
running them (`cmd_*`); this module assembles them and turns errors into one line. An import inside a
function is there only to keep `zoo --help` fast (torch, onnxruntime, numpy, pydantic, matplotlib load
when a command needs them), each marked `# deferred: …`.

Exit codes: 0 done; 1 a runtime error (one line on stderr; --debug raises it), or `zoo eval --check`
refuting its record; 2 a usage error (argparse); 130 interrupted."""

from __future__ import annotations

import argparse
import os
import sys

from zoo.cli import build, evaluate, hub, registry, release, stream
from zoo.cli.errors import one_line
from zoo.version import __version__

__all__ = ["main", "parser"]

GROUPS = (registry, build, evaluate, hub, release, stream)  # `zoo --help` lists the commands in this order


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo", description="icl-zoo: in-context learning by gradient descent, as a model zoo",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples:\n  zoo list gd --source constructed\n  zoo build lsa-gd-zucchet-icl --out ckpt/gd")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")
    p.add_argument("--version", action="version", version=f"icl-zoo {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except BrokenPipeError:  # the reader went away (`zoo stream … | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        print(f"\n{e}" if str(e) else "\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        print(one_line(args, e), file=sys.stderr)
        return 1
