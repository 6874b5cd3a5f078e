"""One way to run many jobs: a sweep's runs and a release's entries go through `run_jobs`.

    local, workers = 1   in this process, one job after another (a job's own progress bars show)
    local, workers = N   N spawned processes (concurrent.futures)
    ray                  Ray tasks on a cluster (`address`; None starts one on this machine), each with
                         `cpus_per_job` CPUs and `gpus_per_job` (fractional) GPUs

Results come back to the caller as they finish, in whatever order the jobs end, so the driver writes its
records (a release's index.json, a sweep's rows) as results arrive. A job that raises never stops the others:
its exception is what comes back for it. A job is a module-level function and picklable arguments; on Ray its
result travels back to the driver, so a job that must work on a cluster of several machines returns what it
made (a release entry returns its files) rather than writing into the driver's folders.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Job:
    key: Hashable  # what the caller knows the result by (an entry's name, a group's index)
    fn: Callable  # a module-level function (it is pickled to a worker process or a Ray task)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    kind: Literal["local", "ray"] = "local"
    workers: int = 1  # local: processes at once (1: in this process)
    address: str | None = None  # ray: the cluster to join ("auto", "ray://host:10001"); None: start one here
    cpus_per_job: float = 1.0  # ray: CPUs each job reserves
    gpus_per_job: float = 0.0  # ray: GPUs each job reserves (fractions share one GPU)

    def __post_init__(self):
        if self.kind not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {self.kind!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")

    @property
    def in_process(self) -> bool:
        """Jobs run here, one after another: their own progress bars show, and they share this process's threads."""
        return self.kind == "local" and self.workers == 1

    def describe(self) -> str:
        if self.kind == "ray":
            return f"Ray ({self.address or 'a local instance'}; {self.cpus_per_job:g} CPU, {self.gpus_per_job:g} GPU a job)"
        return "this process" if self.workers == 1 else f"{self.workers} local processes"


def run_jobs(jobs: Iterable[Job], backend: Backend = Backend()) -> Iterator[tuple[Hashable, object]]:
    """(key, result) for each job as it finishes; the result is the exception where the job raised."""
    jobs = list(jobs)
    if not jobs:
        return
    if backend.kind == "ray":
        yield from _on_ray(jobs, backend)
    elif backend.in_process:
        for job in jobs:
            try:
                yield job.key, job.fn(*job.args, **job.kwargs)
            except Exception as e:  # noqa: BLE001  (one job's failure is its result; the others go on)
                yield job.key, e
    else:
        with ProcessPoolExecutor(min(backend.workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(job.fn, *job.args, **job.kwargs): job.key for job in jobs}
            for future in as_completed(futures):
                error = future.exception()
                yield futures[future], error if error is not None else future.result()


def _on_ray(jobs: list[Job], backend: Backend) -> Iterator[tuple[Hashable, object]]:
    try:
        import ray  # an optional dependency: pip install 'icl-zoo[ray]'
    except ImportError:
        raise RuntimeError("the Ray backend needs Ray: pip install 'icl-zoo[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=backend.address, include_dashboard=False, log_to_driver=False)
    try:
        def call(fn, args, kwargs):
            return fn(*args, **kwargs)

        remote = ray.remote(num_cpus=backend.cpus_per_job, num_gpus=backend.gpus_per_job, max_retries=0)(call)
        pending = {remote.remote(job.fn, job.args, job.kwargs): job.key for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                key = pending.pop(ref)
                try:
                    yield key, ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the job's own exception, as a local run raises it
                    yield key, e.as_instanceof_cause()
                except Exception as e:  # noqa: BLE001  (a lost worker: this job's result)
                    yield key, e
    finally:
        if started_here:
            ray.shutdown()
