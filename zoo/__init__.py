"""icl-zoo: models that learn in context by gradient descent — declared, built, published, streamed.

    import zoo
    zoo.list_entries()                      # the registry (zoo/science/entries/*.toml)
    ckpt = zoo.build("lsa-gd-d10-c10", out="ckpt/lsa-gd")   # construct or train, evaluate, save
    ckpt = zoo.load("ckpt/lsa-gd")          # a folder or a Hub repo id; hashes and shapes verified
    ckpt = zoo.load("gated-rnn-zucchet-icl")  # a released checkpoint, by bare entry name
    ckpt.predict(tokens)                    # eval mode, no autograd graph
    model = zoo.from_pretrained("icl-zoo/lsa-d10-c10")   # the plain torch.nn.Module, in eval mode
    result = zoo.evaluate(model, task="zucchet-icl")   # any model (ONNX, torch, a function) on a frozen split
"""

from zoo.version import __version__


def __getattr__(name: str):
    """`zoo.get_entry`, `zoo.list_entries`: the registry, imported on first use, so that a torch-free
    submodule (zoo.storage.manifest, zoo.storage.locate: checking and finding checkpoints) imports no torch."""
    if name in ("get_entry", "list_entries"):
        from zoo.science import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def build(name: str, out=None, **kwargs):
    from zoo.running.builder import build as _build

    return _build(name, out, **kwargs)


def load(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """Load a checkpoint: a local folder, a Hub repo id `ORG/NAME`, or a bare registry entry name,
    verified (zoo/storage/loading.py says how); `ckpt.trust` says against what."""
    from zoo.storage.loading import load as _load

    return _load(path_or_repo, revision=revision, endpoint=endpoint)


def evaluate(model, *, task: str, split: str = "test", **kwargs) -> dict:
    """Score any model on a task's frozen split beside GD and least squares (the same as `zoo.score`)."""
    return score(model, task=task, split=split, **kwargs)


def from_pretrained(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """The checkpoint's model as a plain `torch.nn.Module` in eval mode (the `from_pretrained` convention of
    PyTorch model hubs): `zoo.load(...)`, hash checks included, then `.model`. `model(tokens)` gives the
    outputs (B, T, d_out), `model.predict(tokens)` the read-out; `zoo.load` keeps the entry, task and metrics."""
    return load(path_or_repo, revision=revision, endpoint=endpoint).model.eval()


def score(model, *, task: str, split: str = "test", **kwargs) -> dict:
    """Score any model on a task's frozen split beside GD and least squares: an ONNX file, a Hub repo
    holding one, a checkpoint, a torch.nn.Module or a function of tokens (zoo/publishing/benchmark.py). The
    same as `zoo.evaluate(model, task=..., split=...)`."""
    from zoo.publishing.benchmark import evaluate as _evaluate

    return _evaluate(model, task=task, split=split, **kwargs)


__all__ = ["__version__", "build", "evaluate", "from_pretrained", "get_entry", "list_entries", "load", "score"]
