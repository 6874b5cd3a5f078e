"""Time from `zoo hub serve` to the first answer of its endpoint, cold (a fresh hub folder: the release is
imported, datasets written) and warm (the same release prepared before: reused by its key).

    python benchmarks/hub_start.py --repeats 3

Each run starts `zoo hub serve --dir DIR --port P` as a user would, polls `GET /api/models?author=icl-zoo`
every 20 ms until it answers 200 with the release's repos, and stops the server. Prints each run and the
median of each kind, with the cold/warm ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_answer(hub_dir: Path, timeout: float = 600.0) -> float:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api/models?author=icl-zoo"
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zoo.cli", "hub", "serve", "--dir", str(hub_dir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"zoo hub serve exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()):
                        return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"no answer from {url} in {timeout} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind")
    ap.add_argument("--json", help="also write the raw timings here")
    args = ap.parse_args(argv)
    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="icl-zoo-hub-bench-") as tmp:
        for i in range(args.repeats):
            hub = Path(tmp) / f"hub-{i}"
            cold.append(time_to_answer(hub))  # a fresh folder: prepared from the shipped release
            print(f"cold {i + 1}: {cold[-1]:.2f} s", flush=True)
            warm.append(time_to_answer(hub))  # the same folder: the prepared release reused
            print(f"warm {i + 1}: {warm[-1]:.2f} s", flush=True)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"median cold {c:.2f} s, warm {w:.2f} s: cold/warm {c / w:.1f}x ({args.repeats} runs each)")
    if args.json:
        Path(args.json).write_text(json.dumps({"cold_s": cold, "warm_s": warm}, indent=1))


if __name__ == "__main__":
    main()
