"""A pytest plugin that sums, per test, the seconds spent in ONNX export (export.onnx_export._export: the
torch.onnx.export call and the graph rewrite) and in check_graph, and writes them to acc-<pid>.json, one file per
worker, in the folder of $EXPORT_TIMER_OUT (default: the current folder).

    PYTHONPATH=reports/engineering/generated/suite-time python -m pytest -q -p exporttimer --durations=0

Produced export-seconds-e2a0f37-contended.json (the workers' files summed; keys are test ids, "('check', id)"
for check_graph) beside everyday-tier-e2a0f37-export-timer-contended.log."""

import json
import os
import time
from pathlib import Path

import pytest

_seconds: dict[str, float] = {}
_current = [""]


def _timed(function, key):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            name = key(_current[0])
            _seconds[name] = _seconds.get(name, 0.0) + time.perf_counter() - start

    return wrapper


def pytest_configure(config):
    import export.onnx_export as onnx_export  # module globals: export_step and friends look both names up here

    onnx_export._export = _timed(onnx_export._export, lambda test: test)
    onnx_export.check_graph = _timed(onnx_export.check_graph, lambda test: str(("check", test)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    yield


def pytest_unconfigure(config):
    out = Path(os.environ.get("EXPORT_TIMER_OUT", "."))
    (out / f"acc-{os.getpid()}.json").write_text(json.dumps(_seconds))
