"""icl-zoo: models that learn in context by gradient descent — declared, built, published, streamed.

    import zoo
    zoo.list_entries()                      # the registry (zoo/entries/*.toml)
    ckpt = zoo.build("lsa-gd-d10-c10", out="ckpt/lsa-gd")   # construct or train, evaluate, save
    ckpt = zoo.load("ckpt/lsa-gd")          # a folder or a Hub repo id; hashes and shapes verified
    ckpt = zoo.load("gated-rnn-zucchet-icl")  # a released checkpoint, by bare entry name
"""

__version__ = "0.2.0"

from zoo.registry import get_entry, list_entries  # noqa: E402


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
