"""icl-zoo: models that learn in context by gradient descent — declared, built, published, streamed.

    import zoo
    zoo.list_entries()                      # the registry (zoo/entries/*.toml)
    ckpt = zoo.build("lsa-gd-d10-c10", out="ckpt/lsa-gd")   # construct or train, evaluate, save
    ckpt = zoo.load("ckpt/lsa-gd")          # a folder or a Hub repo id; hashes and shapes verified
"""

__version__ = "0.1.0"

from zoo.registry import get_entry, list_entries  # noqa: E402


def build(name: str, out=None, **kwargs):
    from zoo.builder import build as _build

    return _build(name, out, **kwargs)


def load(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """Load a checkpoint from a local folder or a Hub repo id (via snapshot_download)."""
    from pathlib import Path

    from zoo.checkpoint import read_checkpoint

    folder = Path(path_or_repo)
    if not folder.is_dir():
        from zoo.hub import resolve_folder

        folder = resolve_folder(str(path_or_repo), revision=revision, endpoint=endpoint)
    return read_checkpoint(folder)


__all__ = ["__version__", "build", "get_entry", "list_entries", "load"]
