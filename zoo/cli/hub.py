"""`zoo publish`, `zoo publish-dataset`, `zoo pull`, `zoo hub serve`: checkpoints and frozen splits to and
from a Hub, and the local hub served as one."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

import zoo
from zoo.cli.output import add_command, print_json
from zoo.publishing import hub
from zoo.publishing.hub_prepare import Preparation
from zoo.publishing.hub_server import COLLECTION_KEY, pending_key
from zoo.storage.locate import ORG, is_checkpoint_file, locate, validate_repo_id


def hub_kwargs(args) -> dict:
    return {"root": Path(args.root)} if args.hub == "local" and args.root else {}


def hub_name(args) -> str:
    """Where a publish went: the local hub's folder, or the Hub's name as given."""
    return f"local hub {Path(args.root) if args.root else hub.default_local_hub()}" if args.hub == "local" else args.hub


def cmd_publish(args) -> int:
    # deferred: these import torch
    from zoo.storage.card import CARD_MARKER, write_card_and_figures
    from zoo.storage.checkpoint import read_checkpoint

    validate_repo_id(args.repo)
    folder = Path(args.source)
    if not folder.is_dir():  # a registry entry: build it first
        folder = Path(args.out or Path("checkpoints") / args.source)
        zoo.build(args.source, folder, steps=args.steps, progress=not args.quiet)
    verified = locate(folder)  # every hash checked before anything leaves the machine
    ckpt = read_checkpoint(verified)
    with tempfile.TemporaryDirectory() as tmp:  # the source folder is never modified by publishing
        staged = Path(tmp) / folder.name
        staged.mkdir()
        # Only the checkpoint's own files, from the bytes that were hashed: config.json, what it lists,
        # and the card with its figures. Anything else in the folder stays on this machine.
        for name, raw in verified.data.items():
            (staged / name).write_bytes(raw)
        left = sorted(p.name for p in folder.iterdir() if p.name not in verified.data and p.name != "README.md"
                      and p.suffix != ".png" and p.name != ".train")
        if left:
            print(f"not published (not part of the checkpoint): {', '.join(left)}")
        readme = folder / "README.md"
        if readme.is_file() and not readme.is_symlink() and CARD_MARKER not in readme.read_text(errors="replace"):
            print(f"keeping the hand-written {readme} (it is not a generated card)")
            (staged / "README.md").write_bytes(readme.read_bytes())
        else:
            write_card_and_figures(ckpt, staged, repo_id=args.repo, dataset_repo=args.dataset_repo,
                                   dataset_revision=args.dataset_revision)
        sha = hub.publish(staged, args.repo, hub=args.hub, repo_type="model", **hub_kwargs(args))
    print(f"published {folder} → {args.repo} ({hub_name(args)}) revision {sha}  ({ckpt.trust})")
    return 0


def cmd_publish_dataset(args) -> int:
    validate_repo_id(args.repo)
    with tempfile.TemporaryDirectory() as tmp:
        folder, hashes = hub.dataset_folder(args.task, Path(tmp), repo=args.repo, revision="main")  # the card loads this repo
        sha = hub.publish(folder, args.repo, hub=args.hub, repo_type="dataset", **hub_kwargs(args))
    print(f"published frozen splits of {args.task} → {args.repo} ({hub_name(args)}) revision {sha}")
    print_json(hashes)
    return 0


def cmd_hub_serve(args) -> int:
    def interrupted(signum, frame):  # SIGTERM as Ctrl-C: the server and its temp folder go down with us
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    root = (Path(args.dir) if args.dir else hub.default_local_hub()).resolve()  # the server serves an absolute root
    proc = None
    try:
        if args.port:  # a busy port is refused before the release is imported (minutes the first time)
            hub.check_port_free(args.port)
        with contextlib.ExitStack() as held:
            preparation = None

            def models_first() -> list[str]:
                """The model repos (about a second); the dataset repos are made once the server listens, and it
                holds a request for one of them until it is ready."""
                nonlocal preparation
                held.enter_context(hub.preparing(root))  # one preparation of a folder at a time: a second server
                preparation = prepare(root)  # waits, then finds it prepared (once per release, then reused)
                if not isinstance(preparation, Preparation):  # prepared whole by another `prepare`
                    return []
                tasks = preparation.models()
                return [*(pending_key("datasets", f"{ORG}/{t}") for t in tasks), *([COLLECTION_KEY] if tasks else [])]

            # the server process starts (imports) while the model repos are prepared, and listens once they are
            proc, endpoint = hub.start_server(root, args.port, meanwhile=None if args.no_release else models_first)
            print(f"serving the local hub {root} at {endpoint}", flush=True)
            print(f"  export HF_ENDPOINT={endpoint}    # then huggingface_hub / datasets / zoo use it", flush=True)
            if isinstance(preparation, Preparation) and preparation.pending:
                prepare_datasets(preparation, proc)
        while proc.poll() is None:
            time.sleep(0.5)
        print(f"error: the hub server exited with code {proc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None:
            hub.stop_server(proc)


def prepare(root: Path):
    """How `zoo hub serve` prepares the local hub `root` for the shipped release: a Preparation, whose model repos
    are made before the server listens and its dataset repos after (prepare_datasets). A replacement that prepares
    `root` whole and returns anything else (as zoo.publishing.hub_prepare.prepare does) is run before it listens."""
    return Preparation(root)


def prepare_datasets(preparation, proc) -> list[str]:
    """Make the dataset repos `preparation` has still to make while `proc` (the hub server) serves the rest,
    telling it as each is ready; one that fails is said in one line here and answered 503 with that line there,
    and the others are still made. Returns the tasks that failed."""
    from tqdm.auto import tqdm

    tasks, failed = list(preparation.pending), []
    if preparation.progress:
        print(f"preparing {len(tasks)} dataset repos meanwhile (a request for one waits until it is ready)",
              file=sys.stderr, flush=True)
    with tqdm(total=len(tasks), unit="repo", file=sys.stderr, desc="dataset repos",
              disable=not preparation.progress) as bar:
        for i, task in enumerate(tasks):
            if proc.poll() is not None:  # the server is gone: nobody to make them for
                return failed + tasks[i:]
            bar.set_postfix_str(task)
            key = pending_key("datasets", f"{ORG}/{task}")
            try:
                preparation.dataset(task)
            except Exception as e:  # any failure of one repo (torch, the disk, a generator): said, the others made
                reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                failed.append(task)
                hub.announce(proc, "failed", key, reason)
                bar.write(f"error: the dataset repo {ORG}/{task} could not be prepared ({reason}); requests for it "
                          "answer 503", file=sys.stderr)
            else:
                hub.announce(proc, "ready", key)
            bar.update()
    if failed:
        hub.announce(proc, "failed", COLLECTION_KEY, f"the dataset repos {', '.join(failed)} could not be prepared")
    else:
        try:
            preparation.finish()
            hub.announce(proc, "ready", COLLECTION_KEY)
        except OSError as e:
            hub.announce(proc, "failed", COLLECTION_KEY, f"the release's marker could not be written: {e}")
            print(f"error: the release's marker could not be written in {preparation.hub_root} ({e})", file=sys.stderr)
            failed.append("(marker)")
    hub.done_announcing(proc)
    if not failed:
        print(f"the dataset repos are ready ({len(preparation.from_cache)} of {len(tasks)} from the cache)",
              file=sys.stderr, flush=True)
    return failed


def cmd_pull(args) -> int:
    """Download a checkpoint repo, check its hashes (zoo.storage.locate), and say where it is. --include keeps only the
    files matching its patterns; --local-dir writes them into that folder (downloaded through a temporary cache,
    not the Hugging Face cache). The checkpoint is downloaded and checked whole either way: its files are checked
    against each other (config.json records their hashes) and a released entry's against the release index."""
    # deferred: imports torch
    from zoo.storage.checkpoint import read_checkpoint

    patterns = include_patterns(args.include)  # checked, as the folder is, before anything is downloaded
    local = local_dir(args.local_dir) if args.local_dir else None
    where = f"{args.repo}@{args.revision or 'main'}"
    with tempfile.TemporaryDirectory(prefix="icl-zoo-pull-") as tmp:
        download = {"cache_dir": tmp} if local else {}
        verified = locate(validate_repo_id(args.repo), revision=args.revision, endpoint=args.endpoint, **download)
        ckpt = read_checkpoint(verified)
        about = f"({ckpt.entry.name}, {ckpt.trust})"
        if local is None and patterns is None:
            print(f"{where} → {verified.folder}  {about}")
            return 0
        names = sorted(p.name for p in verified.folder.iterdir() if is_checkpoint_file(p.name))
        chosen = [n for n in names if patterns is None or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not chosen:
            raise ValueError(f"--include {' '.join(patterns)}: none of {args.repo}'s files match (its files: "
                             f"{', '.join(names)})")
        if local is None:
            print(f"{where} → {verified.folder}: {', '.join(chosen)}  {about}")
            return 0
        local.mkdir(parents=True, exist_ok=True)
        for name in chosen:  # the bytes that were hashed, where locate kept them
            data = verified.data.get(name)
            write_whole(local / name, data if data is not None else (verified.folder / name).read_bytes())
    print(f"{where} → {local}: {', '.join(chosen)}  {about}")
    return 0


MAX_PATTERNS = 64


def include_patterns(patterns: list[str] | None) -> list[str] | None:
    """--include as untrusted input: glob patterns (fnmatch, case-sensitive) over a checkpoint's file names, which
    are all top-level: no '/', '\\', '..', control characters, empty or overlong patterns."""
    if not patterns:
        return None
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"--include: {len(patterns)} patterns; at most {MAX_PATTERNS}")
    for p in patterns:
        if not p or len(p) > 200 or ".." in p or "/" in p or "\\" in p or any(ord(c) < 32 or ord(c) == 127 for c in p):
            raise ValueError(f"--include {p!r}: not a file name pattern (a checkpoint's files are top-level: give a "
                             "pattern such as '*.onnx' or config.json, without '/', '\\' or '..')")
    return patterns


def local_dir(text: str) -> Path:
    """--local-dir: a folder (created if absent) that the pulled files are written into, each replaced whole."""
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--local-dir {text}: not a folder")
    return folder


def write_whole(path: Path, data: bytes) -> None:
    """`data` at `path` through a temporary file renamed over it: a symlink or file already there is replaced,
    never written through, and a failed write leaves what was there."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # created here, with the umask's mode (as a download's files are)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def register(sub) -> None:
    s = add_command(sub, "publish", "publish a checkpoint folder (or build an entry) as a Hub model repo",
                    "zoo publish ckpt/lsa --repo me/lsa-d10-c10",
                    "zoo publish lsa-gd-zucchet-icl --repo me/lsa-gd --hub hf")
    s.add_argument("source", help="checkpoint folder or registry entry name")
    s.add_argument("--repo", required=True, help="ORG/NAME")
    s.add_argument("--hub", default="local", help="'local' (default), 'hf' for huggingface.co, or a Hub URL")
    s.add_argument("--root", help="local hub directory (default: ~/.cache/icl-zoo/publishing/hub or ICL_ZOO_LOCAL_HUB)")
    s.add_argument("--dataset-repo", help="dataset repo holding the frozen splits (pinned in the card)")
    s.add_argument("--dataset-revision", help="its revision (commit sha)")
    s.add_argument("--out", help="where to build an entry given by name")
    s.add_argument("--steps", type=int)
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_publish)

    s = add_command(sub, "publish-dataset", "publish a task's frozen splits as a Hub dataset repo",
                    "zoo publish-dataset linreg-d10-c10 --repo me/linreg-d10-c10")
    s.add_argument("task", help="task name (`zoo show ENTRY` shows an entry's task)")
    s.add_argument("--repo", required=True, help="ORG/NAME")
    s.add_argument("--hub", default="local", help="'local' (default), 'hf' for huggingface.co, or a Hub URL")
    s.add_argument("--root", help="local hub directory (default: ~/.cache/icl-zoo/publishing/hub or ICL_ZOO_LOCAL_HUB)")
    s.set_defaults(fn=cmd_publish_dataset)

    s = add_command(sub, "pull", "download a model repo through huggingface_hub and check its hashes",
                    "HF_ENDPOINT=http://127.0.0.1:8090 zoo pull icl-zoo/gated-rnn-zucchet-icl --include '*.onnx' "
                    "--local-dir graphs")
    s.add_argument("repo", help="Hub model repo ORG/NAME")
    s.add_argument("--revision", help="branch, tag or commit (default: main)")
    s.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    s.add_argument("--include", nargs="+", action="extend", metavar="PATTERN",
                   help="keep only the files matching these glob patterns, e.g. '*.onnx' config.json (repeatable); "
                        "the checkpoint is still downloaded and checked whole")
    s.add_argument("--local-dir", metavar="DIR",
                   help="write the files into DIR (created if absent; files of the same names replaced) instead of "
                        "leaving them in the Hugging Face cache")
    s.set_defaults(fn=cmd_pull)

    s = add_command(sub, "hub", "local hub tools", "zoo hub serve --port 8090")
    hub_sub = s.add_subparsers(dest="hub_command", required=True)
    s = add_command(hub_sub, "serve", "serve the local hub (a read-only Hugging Face Hub) on 127.0.0.1",
                    "zoo hub serve --port 8090    # then: export HF_ENDPOINT=http://127.0.0.1:8090")
    s.add_argument("--dir", help="local hub directory")
    s.add_argument("--port", type=int, help="default: a free port")
    s.add_argument("--no-release", action="store_true", help="serve the hub as it is, without importing the shipped release")
    s.set_defaults(fn=cmd_hub_serve)
