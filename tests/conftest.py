import copy
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


@pytest.fixture(scope="session", autouse=True)
def _exporter_registry_built_once():
    """torch.onnx.export (dynamo) rebuilds its table of ATen → ONNX functions from onnxscript's torchlib on every
    call: ~0.7 s of CPU, half of a small model's export, and the suite exports a few hundred graphs in-process.
    The table depends only on its arguments (the opset), so this process builds it once and gives each export
    its own copy (a custom translation table, which the zoo never passes, would change only that copy): the
    same graphs, byte for byte. Subprocesses (`zoo build` in another interpreter) build their own."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:  # another torch's layout: every export builds its own table
        yield
        return
    build, built = ONNXRegistry.from_torchlib.__func__, {}

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(cls, *args, **kwargs)
        registry = copy.copy(built[key])
        registry.functions = {target: list(decomps) for target, decomps in built[key].functions.items()}
        return registry

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ONNXRegistry, "from_torchlib", classmethod(from_torchlib))
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
