"""Time from `zoo hub serve` to the first answer of its endpoint, from the coldest start to the warmest.

    python benchmarks/hub_start.py --repeats 3

Each run starts `zoo hub serve --dir DIR --port P` as a user would, with its own icl-zoo cache
(ICL_ZOO_CACHE, where the frozen splits and the prepared dataset repos are kept), polls
`GET /api/models?author=icl-zoo` every 20 ms until it answers 200 with the release's repos, and stops the
server. Each repeat takes a new, empty cache through four starts:

    cold          no caches at all: an empty cache and a new hub dir (the frozen splits generated from their
                  seeds through torch, the dataset repos made from them, every model repo written)
    splits        a new hub dir, the frozen splits cached but not the dataset repos (what "cold" meant before
                  the dataset repos were cached: a first `zoo hub serve` after other zoo commands)
    cached        a new hub dir, the dataset repos cached (checked against the hashes the release pins)
    warm          the same hub dir again: the prepared release reused by its key

Prints each run and the median of each kind (medians of the same machine and run, so their ratios hold).
The figures depend on the machine's load: run it on an otherwise idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

KINDS = ("cold", "splits", "cached", "warm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_answer(hub_dir: Path, cache: Path, timeout: float = 600.0) -> float:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api/models?author=icl-zoo"
    env = {**os.environ, "ICL_ZOO_CACHE": str(cache)}
    env.pop("HF_ENDPOINT", None)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zoo.cli", "hub", "serve", "--dir", str(hub_dir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
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
    runs: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="icl-zoo-hub-bench-") as tmp:
        for i in range(args.repeats):
            cache = Path(tmp) / f"cache-{i}"  # empty: nothing generated, nothing prepared
            steps = [("cold", Path(tmp) / f"hub-{i}-cold"), ("splits", Path(tmp) / f"hub-{i}-splits"),
                     ("cached", Path(tmp) / f"hub-{i}-cached"), ("warm", Path(tmp) / f"hub-{i}-cached")]
            for kind, hub in steps:
                if kind == "splits":  # the frozen splits stay; the dataset repos the cold start kept go
                    shutil.rmtree(cache / "hub-datasets", ignore_errors=True)  # (a zoo without that cache: none)
                runs[kind].append(time_to_answer(hub, cache))
                print(f"{kind:>6} {i + 1}: {runs[kind][-1]:.2f} s", flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print("median " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()) + f" ({args.repeats} runs each)")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k}_s": v for k, v in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
