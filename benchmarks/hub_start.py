"""Time from `zoo hub serve` to its first answer, and to its dataset repos, from the coldest start to the warmest.

    python benchmarks/hub_start.py --repeats 3

Each run starts `zoo hub serve --dir DIR --port P` as a user would, with its own icl-zoo cache
(ICL_ZOO_CACHE, where the frozen splits and the prepared dataset repos are kept) and its own Hugging Face home
(HF_HOME, empty), and measures two times from the launch:

    first answer  `GET /api/models?author=icl-zoo`, polled every 20 ms, answers 200 with the release's model repos
    datasets      then `GET /api/datasets?author=icl-zoo` answers 200 with every dataset repo of the release (the
                  server holds that request while the dataset repos are still being made: this is when a
                  `load_dataset` or `dataset_info` sent at launch would have its answer)

then stops the server. Each repeat takes a new, empty cache through four starts:

    cold          no caches at all: an empty cache and a new hub dir (the frozen splits generated from their
                  seeds through torch, the dataset repos made from them, every model repo written)
    splits        a new hub dir, the frozen splits cached but not the dataset repos (a first `zoo hub serve`
                  after other zoo commands)
    cached        a new hub dir, the dataset repos cached (checked against the hashes the release pins)
    warm          the same hub dir again: the prepared release reused by its key

Prints each run, the median of each kind (medians of the same machine and run, so their ratios hold), the CPU
count and the load average before and after. The figures depend on the machine's load: run it on an otherwise
idle one. To time another version of the zoo, run this script with that version's tree first on PYTHONPATH.
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
import urllib.error
import urllib.request
from pathlib import Path

KINDS = ("cold", "splits", "cached", "warm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def release_counts() -> tuple[int, int]:
    """(model repos, dataset repos) of the shipped release: its entries, and their tasks (from config.json)."""
    from zoo.storage.locate import read_index, release_dir

    index = read_index()
    tasks = {json.loads((release_dir() / name / "config.json").read_text())["entry"]["task"]
             for name in index["entries"]}
    return len(index["entries"]), len(tasks)


def _listing(url: str, timeout: float) -> list | None:
    """The JSON list at `url`, or None while the server does not answer it (not listening yet, or 503)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError):  # URLError, HTTPError (a 503 past the server's bound), a timeout
        return None


def time_start(hub_dir: Path, cache: Path, counts: tuple[int, int], timeout: float = 600.0) -> tuple[float, float]:
    """(first answer, dataset repos ready), in seconds from the launch of `zoo hub serve`."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "ICL_ZOO_CACHE": str(cache), "HF_HOME": str(cache / "hf")}
    for name in ("HF_ENDPOINT", "HF_DATASETS_CACHE", "HF_HUB_CACHE", "ICL_ZOO_LOCAL_HUB"):
        env.pop(name, None)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zoo.cli", "hub", "serve", "--dir", str(hub_dir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        times = []
        for kind, count, poll_timeout in (("models", counts[0], 2), ("datasets", counts[1], 300)):
            while True:
                if time.perf_counter() - started > timeout:
                    raise TimeoutError(f"no listing of {count} {kind} repos from {base} in {timeout} s")
                if proc.poll() is not None:
                    raise RuntimeError(f"zoo hub serve exited with {proc.returncode}")
                rows = _listing(f"{base}/{kind}?author=icl-zoo", poll_timeout)
                if rows is not None and len(rows) == count:
                    times.append(time.perf_counter() - started)
                    break
                time.sleep(0.02)
        return times[0], times[1]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind")
    ap.add_argument("--json", help="also write the raw timings here")
    args = ap.parse_args(argv)
    counts = release_counts()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; release: {counts[0]} model "
          f"repos, {counts[1]} dataset repos", flush=True)
    runs: dict[str, dict[str, list[float]]] = {k: {"first": [], "datasets": []} for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="icl-zoo-hub-bench-") as tmp:
        for i in range(args.repeats):
            cache = Path(tmp) / f"cache-{i}"  # empty: nothing generated, nothing prepared
            steps = [("cold", Path(tmp) / f"hub-{i}-cold"), ("splits", Path(tmp) / f"hub-{i}-splits"),
                     ("cached", Path(tmp) / f"hub-{i}-cached"), ("warm", Path(tmp) / f"hub-{i}-cached")]
            for kind, hub in steps:
                if kind == "splits":  # the frozen splits stay; the dataset repos the cold start kept go
                    shutil.rmtree(cache / "hub-datasets", ignore_errors=True)  # (a zoo without that cache: none)
                first, datasets = time_start(hub, cache, counts)
                runs[kind]["first"].append(first)
                runs[kind]["datasets"].append(datasets)
                print(f"{kind:>6} {i + 1}: first answer {first:.2f} s, dataset repos {datasets:.2f} s", flush=True)
    for what, label in (("first", "first answer"), ("datasets", "dataset repos")):
        medians = {k: statistics.median(v[what]) for k, v in runs.items()}
        print(f"median {label}: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items())
              + f" ({args.repeats} runs each)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k}_{what}_s": v[what] for k, v in runs.items() for what in v},
                                              indent=1))


if __name__ == "__main__":
    main()
