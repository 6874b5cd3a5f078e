"""An error said in one line, in a person's terms: a folder that does not exist, a repo id the hub does
not hold (with the released entries it is close to), a hub that cannot be reached."""

from __future__ import annotations

import difflib
from pathlib import Path

from huggingface_hub import constants

from zoo.storage.locate import ORG, read_index

TARGET_ARGS = ("path", "repo", "source", "model")  # the arguments that name a folder or a Hub repo


def one_line(args, e: BaseException) -> str:
    """The error line main prints for a runtime error. Library errors are written to be read: one line,
    not a traceback (--debug shows it). Anything else that escapes (a library's own exception type on a
    hostile file) is named by its type."""
    explained = explain_missing(args, e)
    if explained:
        return f"error: {explained}"
    if isinstance(e, (ValueError, KeyError, OSError, RuntimeError)):
        return f"error: {e}"
    message = " ".join(str(e).split())
    return f"error: {type(e).__name__}: {message[:500]} (--debug for the traceback)"


def looks_like_folder(text: str) -> bool:
    """A path a person typed (./x, ../x, /x, ~/x, a/b/c, x\\y, or under a folder that exists here), not ORG/NAME."""
    path = Path(text).expanduser()
    return (text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
            or (path.parent != Path(".") and path.parent.is_dir()))


def hub_failure(e: BaseException) -> str | None:
    """What a huggingface_hub error means to a person: 'not found' or 'cannot reach'; None for other errors."""
    # an error raised `from None` (e.g. the hub's "no such revision", said with the repo's revisions) speaks for itself
    for err in (e, e.__cause__, None if e.__suppress_context__ else e.__context__):
        if err is None:
            continue
        module, name = type(err).__module__, type(err).__name__
        if module.startswith("huggingface_hub") or name in ("ConnectError", "ConnectionError"):
            text = str(err)
            if name == "LocalEntryNotFoundError" or "ConnectError" in text or "Name or service" in text or "Connection refused" in text:
                return "cannot reach the hub"
            if name == "RevisionNotFoundError":
                return "no such revision"
            return "not found"
    return None


def explain_missing(args, e: BaseException) -> str | None:
    """A folder or repo the command could not find, said in a person's terms: "no such folder" for a path
    that does not exist (never a Hub error about it), and for a repo id the hub does not hold, the released
    entries it is close to (a 401 from a hub means "no such repo" for a reader without a token)."""
    target = next((v for k in TARGET_ARGS if isinstance(v := getattr(args, k, None), str)), None)
    if target is None or Path(target).expanduser().exists():
        return None
    failure = hub_failure(e)
    invalid_id = isinstance(e, ValueError) and "invalid repo id" in str(e)
    if failure is None and not invalid_id:
        return None
    if invalid_id or looks_like_folder(target):
        return f"no such folder: {target}"
    endpoint = getattr(args, "endpoint", None) or constants.ENDPOINT  # HF_ENDPOINT as huggingface_hub read it
    revision = getattr(args, "revision", None)
    what = f"{target}@{revision}" if revision else target
    if failure == "cannot reach the hub":
        message = f"{what}: no such folder here, and the hub {endpoint} cannot be reached to look for a repo of that name"
    elif failure == "no such revision":
        message = f"{target} has no revision {revision!r} on {endpoint}"
    else:
        message = f"{what}: no such folder here, and no such repo on {endpoint}"
    near = released_near(target)
    if near:
        message += f"; did you mean {', '.join(near)}? (released entries; a bare entry name loads the shipped release)"
    else:
        message += "; `zoo list` shows the released entries (a bare entry name loads the shipped release)"
    return message


def released_near(target: str) -> list[str]:
    """Up to four released repo ids close to `target`, whole or by its name part alone (a mistyped org,
    or a bare name with a slash); none where no index is shipped."""
    try:
        released = [f"{ORG}/{n}" for n in read_index()["entries"]]
    except Exception:  # no shipped index: no suggestions, the message stands without them
        return []
    near = difflib.get_close_matches(target, released, n=4, cutoff=0.6)
    for name in difflib.get_close_matches(target.split("/")[-1], [r.split("/", 1)[1] for r in released], n=4, cutoff=0.6):
        if f"{ORG}/{name}" not in near:
            near.append(f"{ORG}/{name}")
    return near[:4]
