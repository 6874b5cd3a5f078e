import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one thread each, subprocesses too
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Frozen splits are generated into a fresh cache per test session (never the user's)."""
    os.environ["ICL_ZOO_CACHE"] = str(tmp_path_factory.mktemp("icl-zoo-cache"))
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    yield


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def _denormals_kept_between_tests():
    """`zoo build`, `zoo sweep` and `zoo release build` flush denormals for their whole process
    (zoo/running/train.py); tests run those commands in this one, so each test starts from torch's default."""
    yield
    torch.set_flush_denormal(False)
