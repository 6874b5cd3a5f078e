"""`zoo.load`: a checkpoint from a folder, a Hub repo id or a bare registry entry name, hash-checked
(`ckpt.trust`: against the shipped release index, or the checkpoint's own manifest). Below the
package's face (zoo/__init__.py) so that the modules under it (the benchmark) load without importing it."""

from __future__ import annotations


def load(path_or_repo, *, revision: str | None = None, endpoint: str | None = None):
    """Load a checkpoint: a local folder, a Hub repo id `ORG/NAME`, or a bare registry entry name.

    A bare name (`zoo.load("gated-rnn-zucchet-icl")`) gives the released checkpoint: from the
    configured Hub (`endpoint` or HF_ENDPOINT) as `icl-zoo/<name>` at the release tag when one is
    set, otherwise from the release shipped with the package; never rebuilt.

    A released entry, by bare name or as `icl-zoo/<entry>` at any revision, must match the shipped
    `release/index.json` file for file, or is refused; anything else is checked only against its own
    config.json. `ckpt.trust` says which ("verified against release v…" or "self-consistent, not
    checked against a release").

    The same resolver as `Checkpoint.from_pretrained` (zoo.storage.checkpoint.open_checkpoint: locate, then build
    from the located files): the id validated, only the checkpoint's own files downloaded, the trust root
    checked, each file parsed from the hashed bytes."""
    # deferred: zoo.storage.checkpoint (and the registry) import torch, and importing this module loads none
    from zoo.science.registry import default_registry, unknown_entry_error
    from zoo.storage.checkpoint import build_checkpoint
    from zoo.storage.locate import locate

    return build_checkpoint(locate(path_or_repo, revision=revision, endpoint=endpoint, names=default_registry().entries,
                                   unknown=unknown_entry_error))
