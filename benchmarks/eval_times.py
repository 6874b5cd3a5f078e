"""How long a user waits for `zoo eval NAME` on every released entry, and for `zoo leaderboard TASK`.

    python benchmarks/eval_times.py                       # every released entry, then the zucchet-icl leaderboard
    python benchmarks/eval_times.py --only mamba-nd lru-out-zucchet-icl --leaderboard gdssm-nd-x5-y3-n10
    python benchmarks/eval_times.py --json raw.json

Each command runs as a user types it, in a fresh interpreter (imports, the checkpoint's hash checks, the frozen
split's read and hash included), on the entry's whole test split, with OMP_NUM_THREADS (default 1) threads. Prints
the wall-clock seconds of each, slowest first, with the load average before and after: the figures move with the
machine's load, so compare only runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], env: dict) -> float:
    """Wall-clock seconds of `command`; it must succeed."""
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="ENTRY", help="these released entries (default: every one)")
    parser.add_argument("--leaderboard", nargs="*", default=["zucchet-icl"], metavar="TASK",
                        help="leaderboards to time after the entries (default: zucchet-icl; none: --leaderboard)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each command (default 1)")
    parser.add_argument("--json", type=Path, help="also write the raw rows here")
    args = parser.parse_args()
    names = args.only or list(json.loads((ROOT / "release" / "index.json").read_text())["entries"])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    zoo = [sys.executable, "-m", "zoo.cli"]
    rows, load = [], [os.getloadavg()[0]]
    for name in names:
        rows.append({"command": f"zoo eval {name} --json", "seconds": timed([*zoo, "eval", name, "--json"], env)})
        print(f"{rows[-1]['seconds']:6.2f} s  {rows[-1]['command']}", file=sys.stderr, flush=True)
    for task in args.leaderboard:
        with tempfile.TemporaryDirectory() as out:
            seconds = timed([*zoo, "leaderboard", task, "--out", out, "--quiet"], env)
        rows.append({"command": f"zoo leaderboard {task} --out DIR", "seconds": seconds})
        print(f"{seconds:6.2f} s  {rows[-1]['command']}", file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    print(f"\n{os.cpu_count()} CPUs, {args.threads} thread(s) a command; load average {load[0]:.2f} before, "
          f"{load[1]:.2f} after\n\n| seconds | command |\n|---|---|")
    for row in sorted(rows, key=lambda r: -r["seconds"]):
        print(f"| {row['seconds']:.2f} | `{row['command']}` |")
    evals = sorted(r["seconds"] for r in rows if r["command"].startswith("zoo eval"))
    if evals:
        print(f"\n`zoo eval NAME`: {len(evals)} entries, median {evals[len(evals) // 2]:.2f} s, slowest {evals[-1]:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "load": load, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
