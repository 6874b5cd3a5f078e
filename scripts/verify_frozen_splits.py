"""Build every frozen split of the registry from scratch and verify its pinned hash (run on a
machine other than the one that pinned them: a different CPU, BLAS and torch build).

    python scripts/verify_frozen_splits.py
"""
import os
import sys
import tempfile
import time

os.environ.setdefault("ICL_ZOO_CACHE", tempfile.mkdtemp())
from zoo.science.registry import default_registry  # noqa: E402
from zoo.science.tasks.frozen import load_split  # noqa: E402

bad = 0
for name, spec in sorted(default_registry().tasks.items()):
    for split in spec.splits:
        start = time.perf_counter()
        try:
            load_split(name, split, spec=spec)
            print(f"ok   {name}/{split} ({time.perf_counter() - start:.1f} s)")
        except Exception as err:  # report every split, then fail
            bad += 1
            print(f"FAIL {name}/{split}: {err}")
sys.exit(1 if bad else 0)
