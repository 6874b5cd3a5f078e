"""Hub I/O: resolve a repo id to a local snapshot through huggingface_hub."""

from __future__ import annotations

from pathlib import Path


def resolve_folder(repo_id: str, *, revision: str | None = None, endpoint: str | None = None,
                   cache_dir=None, token=None) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, endpoint=endpoint, cache_dir=cache_dir, token=token))
