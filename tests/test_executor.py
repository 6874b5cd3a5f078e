"""One way to run many jobs (zoo.running.executor): in this process, in local processes, or on Ray; results
come back keyed, as they finish, and a failing job is its own result."""

from __future__ import annotations

import math
import operator

import pytest

from zoo.running.executor import Backend, Job, run_jobs

JOBS = [Job("four", math.sqrt, (16.0,)), Job("bad", math.sqrt, (-1.0,)), Job("sum", operator.add, (2, 3))]


def _collect(backend):
    results = dict(run_jobs(JOBS, backend))
    assert results["four"] == 4.0 and results["sum"] == 5
    assert isinstance(results["bad"], ValueError) and "math domain error" in str(results["bad"])
    return results


def test_in_this_process_and_in_spawned_processes_give_the_same_results():
    inline, pooled = _collect(Backend()), _collect(Backend(workers=2))
    assert inline.keys() == pooled.keys() == {"four", "bad", "sum"}


def test_bad_backends_are_refused_in_one_line():
    with pytest.raises(ValueError, match="backend must be 'local' or 'ray', got 'slurm'"):
        Backend("slurm")
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        Backend(workers=0)
    assert list(run_jobs([], Backend("ray"))) == []  # nothing to run starts nothing
