"""`zoo release …` (build, refresh, plan, archive, unpack, publish) and `zoo quickstart`: the zoo's release,
every entry's checkpoint built, indexed, shipped and served."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from zoo.cli.build import training_process
from zoo.cli.output import add_command
from zoo.running.executor import Backend
from zoo.storage import locate


def release_root(args) -> Path:
    return Path(args.root) if args.root else locate.release_dir()


def cmd_build(args) -> int:
    training_process()
    # deferred: imports torch
    from zoo.publishing import release

    root = release_root(args)
    started = time.perf_counter()
    backend = Backend(args.backend, workers=args.workers, address=args.address, gpus_per_job=args.gpus_per_entry)
    index = release.build_release(root, only=args.only, time_budget=args.time_budget, device=args.device,
                                  threads=args.threads, force=args.force, compiled=not args.no_compile,
                                  backend=backend)
    print(f"release {index['version']}: {len(index['entries'])} entries in {root} "
          f"({time.perf_counter() - started:.0f} s); index: {root / locate.INDEX_MD}")
    if args.archive:
        path = release.write_archive(root, Path(args.archive))
        print(f"archive {path}: {path.stat().st_size / 2**20:.2f} MiB "
              f"(on another machine: zoo release unpack --adopt-index {path})")
    return 0


def cmd_refresh(args) -> int:
    # deferred: these import torch
    from zoo.publishing import release
    from zoo.publishing.leaderboard import write_leaderboards
    from zoo.publishing.report import write_release_summary

    root = release_root(args)
    index = release.refresh_release(root, only=args.only, graphs=args.graphs)
    done = len(args.only) if args.only else len(index["entries"])
    print(f"re-rendered the cards of {done} of {len(index['entries'])} released entries and the index in {root}")
    readme = Path(root).resolve().parent / "reports" / "README.md"  # in a checkout: the reports' generated counts
    if readme.is_file() and write_release_summary(readme, index):
        print(f"rewrote the release's counts in {readme}")
    if args.leaderboards:
        written = write_leaderboards(root)
        print(f"wrote {len(written)} leaderboard files in {root / 'leaderboards'}")
    return 0


def cmd_plan(args) -> int:
    # deferred: imports torch
    from zoo.publishing import release

    release.print_plan(device=args.device, only=args.only, threads=args.threads, compiled=not args.no_compile)
    return 0


def cmd_archive(args) -> int:
    # deferred: imports torch
    from zoo.publishing import release

    path = release.write_archive(release_root(args), Path(args.out))
    print(f"archive {path}: {path.stat().st_size / 2**20:.2f} MiB")
    return 0


def cmd_unpack(args) -> int:
    # deferred: imports torch
    from zoo.publishing import release

    root = release_root(args)
    release.unpack_archive(Path(args.archive), root, adopt_index=args.adopt_index)
    if args.adopt_index:
        print(f"unpacked {args.archive} into {root}: ITS index.json IS NOW THE TRUST ROOT there (every file "
              "hash-checked against the archive's own index, not verified against the index shipped before)")
    else:
        print(f"unpacked {args.archive} into {root} (every file hash-verified against the shipped index "
              f"{locate.release_dir() / locate.INDEX_JSON})")
    return 0


def cmd_publish(args) -> int:
    # deferred: imports torch
    from zoo.publishing import release

    out = release.publish_release(args.org, hub=args.hub, root=release_root(args), datasets=not args.no_datasets)
    print(f"published {len(out['repos'])} repos at tag {out['version']}; collection {out['collection']}")
    return 0


def cmd_quickstart(args) -> int:
    # deferred: imports torch and onnxruntime
    from zoo.publishing.quickstart import run, run_release

    if args.from_scratch:
        run(Path(args.out), steps=args.steps)
    else:
        run_release(Path(args.out))
        print(f"wrote the demo's files (its local hub) in {Path(args.out)}/", file=sys.stderr)
    return 0


def register(sub) -> None:
    s = add_command(sub, "release", "the zoo's release: every entry's checkpoint, built, indexed, shipped and served",
                    "zoo release plan", "zoo release build --only lsa-d10-c10 --workers 2")
    rel_sub = s.add_subparsers(dest="release_command", required=True)
    register_build(rel_sub)
    s = add_command(rel_sub, "refresh", "re-render the cards and the index of released entries (no retraining)",
                    "zoo release refresh --only lsa-d10-c10 --graphs")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.add_argument("--graphs", action="store_true", help="also re-export the ONNX graphs from the released weights")
    s.add_argument("--leaderboards", action="store_true",
                   help="also re-score every released entry for release/leaderboards/ (a few minutes on a CPU)")
    s.set_defaults(fn=cmd_refresh)
    s = add_command(rel_sub, "plan", "each trained entry's cost at its recipe length, from measured throughput here",
                    "zoo release plan --device cuda --only mamba-1d lsa-d10-c10")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--device", help="cpu, cuda … (default: cuda if available)")
    s.add_argument("--threads", type=int, help="torch threads")
    s.add_argument("--no-compile", action="store_true", help="measure eager training only (no compiled column)")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_plan)
    s = add_command(rel_sub, "archive", "write the release as one .tar.gz", "zoo release archive release.tar.gz")
    s.add_argument("out", help="the archive to write (.tar.gz)")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_archive)
    s = add_command(rel_sub, "unpack", "unpack a release archive into release/ (hash-verified against the shipped index)",
                    "zoo release unpack release.tar.gz", "zoo release unpack new-release.tar.gz --adopt-index")
    s.add_argument("archive", help="a release archive (.tar.gz, from `zoo release archive` or `build --archive`)")
    s.add_argument("--adopt-index", action="store_true",
                   help="a NEW release built elsewhere: verify against the archive's own index, which becomes the "
                        "trust root (default: every entry must match the shipped release/index.json)")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_unpack)
    s = add_command(rel_sub, "publish", "push every released repo and dataset to a Hub, tagged, in a Collection",
                    "zoo release publish --org icl-zoo")
    s.add_argument("--org", required=True)
    s.add_argument("--hub", default="hf", help="'hf' for huggingface.co, or a Hub URL")
    s.add_argument("--no-datasets", action="store_true")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_publish)

    s = add_command(sub, "quickstart", "pull a released model from a served hub, stream it with ONNX, re-score it",
                    "zoo quickstart", "zoo quickstart --from-scratch --steps 500 --out demo")
    s.add_argument("--out", default="quickstart-out")
    s.add_argument("--from-scratch", action="store_true",
                   help="the second demo: construct θ_GD, train an LSA on CPU, publish and pull it back")
    s.add_argument("--steps", type=int, default=1500, help="with --from-scratch: training steps")
    s.set_defaults(fn=cmd_quickstart)


def register_build(rel_sub) -> None:
    s = add_command(rel_sub, "build", "build every entry (or --only …) into release/; resumable entry by entry",
                    "zoo release build --workers 4 --threads 1",
                    "zoo release build --only lsa-d10-c10 --time-budget 600 --archive release.tar.gz",
                    "zoo release build --backend ray --address auto --gpus-per-entry 0.25")
    s.add_argument("--only", nargs="+", metavar="ENTRY")
    s.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="per trained entry: train at most this long (steps chosen from measured throughput, "
                        "recorded as steps run / recipe steps); default: the recipe's length")
    s.add_argument("--device", help="cpu, cuda … (default: cuda if available)")
    s.add_argument("--workers", type=int, default=1, help="local backend: entries built at once in separate processes")
    s.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local processes (default), or Ray tasks on a cluster (this process writes index.json)")
    s.add_argument("--address", help="Ray: the cluster to join (e.g. auto); default: start Ray on this machine")
    s.add_argument("--gpus-per-entry", type=float, default=0.0, help="Ray: fraction of a GPU each entry reserves")
    s.add_argument("--threads", type=int, help="torch threads per worker (1 on a CPU with --workers = cores)")
    s.add_argument("--force", action="store_true", help="rebuild entries that are already current")
    s.add_argument("--no-compile", action="store_true", help="train eagerly (default: through torch.compile, "
                   "except entries that run as CUDA-graph ensembles)")
    s.add_argument("--archive", metavar="TAR_GZ", help="also write the release as one archive")
    s.add_argument("--root", help="release folder (default: the shipped release/)")
    s.set_defaults(fn=cmd_build)
