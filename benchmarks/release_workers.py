"""Two builds at once on one thread each, against one build on two threads (`zoo release build --workers 2 --threads 1`).

    python benchmarks/release_workers.py mamba-1d:3000 lru-out-zucchet-icl:4000 gd-ssm-1d:12000

For each ENTRY:STEPS it times the compiled training step (`zoo.publishing.release.measure_rate`, after the
compilation) in one process with 2 threads, then in two processes with 1 thread each started
together, and prints the machine's throughput both ways and their ratio. Give each entry enough
steps that the two processes' timed windows overlap (~15 s at its rate).
"""

from __future__ import annotations

import subprocess
import sys

ONE = r"""
import sys, json, torch
torch.set_num_threads(int(sys.argv[2]))
from zoo.publishing.release import measure_rate
print(json.dumps(measure_rate(sys.argv[1], "cpu", int(sys.argv[3]), compiled=True)))
"""


def start(name: str, threads: int, steps: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ONE, name, str(threads), steps], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def main() -> None:
    if len(sys.argv) < 2 or any(":" not in a for a in sys.argv[1:]):
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        name, steps = arg.split(":")
        alone = float(start(name, 2, steps).communicate()[0])
        pair = [start(name, 1, steps), start(name, 1, steps)]
        rates = [float(p.communicate()[0]) for p in pair]
        print(f"{name:28} 2 threads alone {alone:8.1f} | two 1-thread runs at once {rates[0]:7.1f} + {rates[1]:7.1f}"
              f" = {sum(rates):8.1f} steps/s ({sum(rates) / alone:.2f}×)", flush=True)


if __name__ == "__main__":
    main()
