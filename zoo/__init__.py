"""icl-zoo: models that learn in context by gradient descent — declared, built, published, streamed.

    import zoo
    zoo.list_entries()                      # the registry (zoo/entries/*.toml)
    ckpt = zoo.build("lsa-gd-d10-c10", out="ckpt/lsa-gd")   # construct or train, evaluate, save
    ckpt = zoo.load("ckpt/lsa-gd")          # a folder or a Hub repo id; hashes and shapes verified
    ckpt = zoo.load("gated-rnn-zucchet-icl")  # a released checkpoint, by bare entry name
"""

from zoo.version import __version__


def __getattr__(name: str):
    """`zoo.get_entry`, `zoo.list_entries`: the registry, imported on first use, so that a torch-free
    submodule (zoo.manifest, zoo.locate: checking and finding checkpoints) imports no torch."""
    if name in ("get_entry", "list_entries"):
        from zoo import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def build(name: str, out=None, **kwargs):
    from zoo.builder import build as _build

    return _build(name, out, **kwargs)


def load(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """Load a checkpoint: a local folder, a Hub repo id `ORG/NAME`, or a bare registry entry name.

    A bare name (`zoo.load("gated-rnn-zucchet-icl")`) gives the released checkpoint: from the
    configured Hub (`endpoint` or HF_ENDPOINT) as `icl-zoo/<name>` at the release tag when one is
    set, otherwise from the release shipped with the package; hash-verified, never rebuilt."""
    from zoo.checkpoint import read_checkpoint
    from zoo.release import resolve

    return read_checkpoint(resolve(path_or_repo, revision=revision, endpoint=endpoint))


__all__ = ["__version__", "build", "get_entry", "list_entries", "load"]
