"""icl-zoo: models that learn in context by gradient descent — declared, built, published, streamed.

    import zoo
    zoo.list_entries()                      # the registry (zoo/science/entries/*.toml)
    ckpt = zoo.build("lsa-gd-d10-c10", out="ckpt/lsa-gd")   # construct or train, evaluate, save
    ckpt = zoo.load("ckpt/lsa-gd")          # a folder or a Hub repo id; hashes and shapes checked
    ckpt = zoo.load("gated-rnn-zucchet-icl")  # a released checkpoint, by bare entry name
    ckpt.predict(tokens)                    # eval mode, no autograd graph
    model = zoo.from_pretrained("icl-zoo/lsa-d10-c10")   # the plain torch.nn.Module, in eval mode
    model.save_pretrained("my-lsa")         # saved back through its checkpoint (no ONNX graphs: `zoo export my-lsa`)
    zoo.list_models("lsa-*")                # entry names, as timm.list_models; pretrained=True: released ones only
    model = zoo.create_model("lsa-d10-c10")  # the untrained model; pretrained=True: the released weights
    result = zoo.evaluate(model, task="zucchet-icl")   # any model (ONNX, torch, a function) on a frozen split

`import zoo` loads no torch: every function below imports what it uses when it is called.
"""

from zoo.version import __version__


def list_entries(filter: str | None = None, **fields):
    """Registry entries whose name contains `filter` and whose fields match (arch_type=, source=, task=)."""
    # deferred, as every import below: the registry imports torch, and `import zoo` must not
    from zoo.science.registry import list_entries as _list_entries

    return _list_entries(filter, **fields)


def get_entry(name: str):
    """The registry entry `name` (its arch, task, source, paper and expected results)."""
    from zoo.science.registry import get_entry as _get_entry  # deferred: torch

    return _get_entry(name)


def list_models(pattern: str | None = None, pretrained: bool = False) -> list[str]:
    """Entry names matching the fnmatch `pattern` (e.g. "lsa-*", "*zucchet*"), sorted, as `timm.list_models`;
    `pretrained=True`: only entries with a released checkpoint in the shipped release/index.json."""
    import fnmatch

    from zoo.science.registry import default_registry  # deferred: torch

    names = sorted(default_registry().entries)
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if pretrained:
        from zoo.storage.locate import read_index

        released = read_index()["entries"]
        names = [n for n in names if n in released]
    return names


def create_model(name: str, pretrained: bool = False, **kwargs):
    """The model of registry entry `name`, as `timm.create_model`: untrained (freshly initialised, in train mode)
    by default; `pretrained=True`: the released weights, as `zoo.from_pretrained(name, **kwargs)` gives them."""
    if pretrained:
        return from_pretrained(name, **kwargs)
    if kwargs:
        raise TypeError(f"create_model() takes revision/endpoint only with pretrained=True, got {sorted(kwargs)}")
    from zoo.science.models import create_model as _create_model  # deferred: torch
    from zoo.science.registry import get_entry as _get_entry
    from zoo.science.registry import get_task_spec

    entry = _get_entry(name)
    return _create_model(entry.arch, get_task_spec(entry.task).build())


def build(name: str, out=None, **kwargs):
    from zoo.running.builder import build as _build

    return _build(name, out, **kwargs)


def load(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """Load a checkpoint: a local folder, a Hub repo id `ORG/NAME`, or a bare registry entry name,
    its file hashes checked (zoo/storage/loading.py says how); `ckpt.trust` says against what: the shipped
    release index (a released entry: verified) or the checkpoint's own manifest."""
    from zoo.storage.loading import load as _load

    return _load(path_or_repo, revision=revision, endpoint=endpoint)


def evaluate(model, *, task: str, split: str = "test", **kwargs) -> dict:
    """Score any model on a task's frozen split beside GD and least squares (the same as `zoo.score`)."""
    return score(model, task=task, split=split, **kwargs)


def from_pretrained(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """The checkpoint's model as a plain `torch.nn.Module` in eval mode (the `from_pretrained` convention of
    PyTorch model hubs): `zoo.load(...)`, hash checks included, then its model. `model(tokens)` gives the
    outputs (B, T, d_out), `model.predict(tokens)` the read-out; `zoo.load` keeps the entry, task and metrics.
    `model.save_pretrained(folder)` saves it back through its checkpoint (`zoo.from_pretrained(folder)` then
    gives the same outputs) and `model.push_to_hub(repo_id)` uploads that folder (Checkpoint.pretrained_module)."""
    return load(path_or_repo, revision=revision, endpoint=endpoint).pretrained_module()


def score(model, *, task: str, split: str = "test", **kwargs) -> dict:
    """Score any model on a task's frozen split beside GD and least squares: an ONNX file, a Hub repo
    holding one, a checkpoint, a torch.nn.Module or a function of tokens (zoo/publishing/benchmark.py). The
    same as `zoo.evaluate(model, task=..., split=...)`."""
    from zoo.publishing.benchmark import evaluate as _evaluate

    return _evaluate(model, task=task, split=split, **kwargs)


__all__ = ["__version__", "build", "create_model", "evaluate", "from_pretrained", "get_entry", "list_entries",
           "list_models", "load", "score"]
