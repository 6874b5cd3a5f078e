import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Frozen splits are generated into a fresh cache per test session (never the user's)."""
    os.environ["ICL_ZOO_CACHE"] = str(tmp_path_factory.mktemp("icl-zoo-cache"))
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    yield


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)
