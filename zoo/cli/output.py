"""What the commands write: JSON, a metrics listing, and each command's help with an example."""

from __future__ import annotations

import argparse
import json
import sys


def print_json(obj) -> None:
    """Indented JSON with its unicode as it is (θ, η, ≤), or escaped where the output cannot encode it."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    try:
        text.encode(sys.stdout.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    print(text)


def print_metrics(metrics: dict) -> None:
    """One `name: value` line per metric, the names right-aligned."""
    width = max(map(len, metrics), default=0)
    for k, v in metrics.items():
        print(f"{k:>{width}}: {v}")


def add_command(sub, name: str, help: str, example: str, *more: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose help ends with an example line or two, printed as written."""
    examples = (example, *more)
    lines = "\n".join(f"  {line}" for line in examples)
    return sub.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog=f"{'Example' if len(examples) == 1 else 'Examples'}:\n{lines}", **kwargs)
