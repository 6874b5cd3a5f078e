"""How long `zoo.load` takes for a released entry once the zoo is imported, beside the same work
done the way it was before each file was read once (the release check and the config check each
reading and hashing every file).

    python benchmarks/load_latency.py                 # every released entry, 5 repeats
    python benchmarks/load_latency.py --only gated-rnn-zucchet-icl lsa-d10-c10 --repeats 20

Prints per entry the median seconds of `zoo.load(name)` and of its checking step alone, now and
twice-hashed (the baseline, measured in the same run), and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import zoo
from zoo.storage.locate import FileReader, read_index, release_dir, verify_folder, verify_release
from zoo.storage.manifest import verify_files


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="ENTRY")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    index = read_index()
    names = args.only or sorted(index["entries"])
    zoo.load(names[0])  # imports (torch, the registry, the families) are not the load's cost
    print(f"{'entry':36s} {'zoo.load s':>10s} {'check s':>9s} {'check, hashed twice s':>22s} {'ratio':>6s}")
    loads = []
    for name in names:
        row, folder = index["entries"][name], release_dir() / name
        load = median_seconds(lambda: zoo.load(name), args.repeats)
        once = median_seconds(lambda: verify_release(folder, row, index["version"]), args.repeats)
        twice = median_seconds(lambda: (verify_folder(folder, row, FileReader(folder)), verify_files(folder)), args.repeats)
        loads.append(load)
        print(f"{name:36s} {load:10.4f} {once:9.4f} {twice:22.4f} {twice / once:6.2f}")
    print(f"zoo.load over {len(names)} released entries: median {statistics.median(loads):.4f} s, max {max(loads):.4f} s")


if __name__ == "__main__":
    main()
