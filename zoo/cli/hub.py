"""`zoo publish`, `zoo publish-dataset`, `zoo pull`, `zoo hub serve`: checkpoints and frozen splits to and
from a Hub, and the local hub served as one."""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

import zoo
from zoo.cli.output import add_command, print_json
from zoo.publishing import hub
from zoo.publishing.hub_prepare import prepare
from zoo.storage.locate import locate, validate_repo_id


def hub_kwargs(args) -> dict:
    return {"root": Path(args.root)} if args.hub == "local" and args.root else {}


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
    print(f"published {folder} → {args.repo} ({args.hub}) revision {sha}  ({ckpt.trust})")
    return 0


def cmd_publish_dataset(args) -> int:
    validate_repo_id(args.repo)
    with tempfile.TemporaryDirectory() as tmp:
        folder, hashes = hub.dataset_folder(args.task, Path(tmp), repo=args.repo, revision="main")  # the card loads this repo
        sha = hub.publish(folder, args.repo, hub=args.hub, repo_type="dataset", **hub_kwargs(args))
    print(f"published frozen splits of {args.task} → {args.repo} ({args.hub}) revision {sha}")
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
        if not args.no_release:
            with hub.preparing(root):  # one preparation of a folder at a time; a second server waits for it
                prepare(root)  # once per release (progress shown); reused while the release is unchanged
        proc, endpoint = hub.start_server(root, args.port)
        print(f"serving the local hub {root} at {endpoint}", flush=True)
        print(f"  export HF_ENDPOINT={endpoint}    # then huggingface_hub / datasets / zoo use it", flush=True)
        while proc.poll() is None:
            time.sleep(0.5)
        print(f"error: the hub server exited with code {proc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None:
            hub.stop_server(proc)


def cmd_pull(args) -> int:
    # deferred: imports torch
    from zoo.storage.checkpoint import read_checkpoint

    verified = locate(validate_repo_id(args.repo), revision=args.revision, endpoint=args.endpoint)
    ckpt = read_checkpoint(verified)
    print(f"{args.repo}@{args.revision or 'main'} → {verified.folder}  ({ckpt.entry.name}, {ckpt.trust})")
    return 0


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

    s = add_command(sub, "pull", "download a model repo through huggingface_hub and verify it",
                    "HF_ENDPOINT=http://127.0.0.1:8090 zoo pull icl-zoo/gated-rnn-zucchet-icl")
    s.add_argument("repo", help="Hub model repo ORG/NAME")
    s.add_argument("--revision")
    s.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    s.set_defaults(fn=cmd_pull)

    s = add_command(sub, "hub", "local hub tools", "zoo hub serve --port 8090")
    hub_sub = s.add_subparsers(dest="hub_command", required=True)
    s = add_command(hub_sub, "serve", "serve the local hub (a read-only Hugging Face Hub) on 127.0.0.1",
                    "zoo hub serve --port 8090    # then: export HF_ENDPOINT=http://127.0.0.1:8090")
    s.add_argument("--dir", help="local hub directory")
    s.add_argument("--port", type=int, help="default: a free port")
    s.add_argument("--no-release", action="store_true", help="serve the hub as it is, without importing the shipped release")
    s.set_defaults(fn=cmd_hub_serve)
