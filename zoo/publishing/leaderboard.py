"""Per-task leaderboards: every released entry on a task's frozen test split, ranked beside GD and
least squares and any outside model, each scored by zoo.publishing.benchmark on the same tasks.

    zoo leaderboard zucchet-icl                               # table on stdout; leaderboards/zucchet-icl.{md,png}
    zoo leaderboard zucchet-icl --add mine=model.onnx --out board
    board = leaderboard("zucchet-icl", add={"mine": my_torch_module})   # from Python: any model zoo.publishing.benchmark takes

The release carries one per task (`write_leaderboards(release_root)` → release/leaderboards/<task>.md
and .png), and each task's dataset card links its own.

A model's name is data, never markup: `validate_name` takes 1–64 letters, digits, spaces and - _ . + ( )
and refuses anything else in one line, before anything is scored, and again when a board is drawn
(a `Leaderboard` built by hand); the references' own labels are backslash-escaped where Markdown would
read them (`*GD, 1 step at η\\* = …*`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zoo.publishing.benchmark import (
    PER_STEP_KEY,
    as_candidate,
    checkpoint_candidate,
    load_frozen,
    score,
    split_references,
)

FOLDER = "leaderboards"  # in the release root
KIND_COLOURS = {"released": "C0", "reference": "0.3", "outside": "C3"}
# A model's name on a board is data, never markup: letters, digits, spaces and - _ . + ( ), at most 64, no
# space at either end. Nothing of Markdown (| * ` # [ ] ! < >), HTML or matplotlib's mathtext ($) gets through.
NAME = re.compile(r"^[A-Za-z0-9_.+()-](?:[A-Za-z0-9 _.+()-]{0,62}[A-Za-z0-9_.+()-])?$")
MAX_NAME = 64
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|!~&#$])")  # backslash-escaped in the labels the zoo writes


def validate_name(name) -> str:
    """`name` when it may stand on a leaderboard (see NAME), else ValueError in one line."""
    if isinstance(name, str) and NAME.match(name):
        return name
    shown = ascii(name[:MAX_NAME + 1]) + ("…" if len(name) > MAX_NAME + 1 else "") if isinstance(name, str) \
        else f"{type(name).__name__} {repr(name)[:40]!a}"  # ascii(): one printable line whatever it holds
    raise ValueError(f"leaderboard name {shown}: a name is 1 to {MAX_NAME} letters, digits, spaces and - _ . + ( ), "
                     "without a space at either end (names are shown as data, never markup)")


def _checked(board: Leaderboard) -> list[Row]:
    """The board's rows, each model's name validated (a board built by hand or read back goes through it too)."""
    for r in board.rows:
        if r.kind != "reference":  # the references' labels are the zoo's own, escaped where drawn
            validate_name(r.name)
    return board.rows


def _markdown_text(text: str) -> str:
    """The zoo's own label as Markdown text: every character Markdown could read as markup backslash-escaped."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)


@dataclass
class Row:
    name: str
    kind: str  # "released" (an entry of the release), "reference" (GD, least squares) or "outside"
    loss: float
    loss_se: float
    diff: float | None = None  # paired difference from one GD step at η*, task by task (None: no GD on this task)
    diff_se: float | None = None
    pred_gap: float | None = None  # mean ‖ŷ − ŷ_GD‖²
    cosine: float | None = None  # sensitivity cosine to GD
    sensitivity: str = ""  # how the cosine was computed


@dataclass
class Leaderboard:
    task: str
    split: str
    dataset: str  # "<task>/<split>"
    dataset_sha256: str
    n_tasks: int
    gd_eta: float | None  # η* of the GD step every Δ is taken against (None: a teacher–student task)
    description: str
    rows: list[Row]  # best (lowest loss) first


def model_row(name: str, kind: str, metrics: dict) -> Row:
    return Row(name, kind, metrics["test_loss"], metrics["test_loss_se"], metrics.get("gd_paired_diff"),
               metrics.get("gd_paired_se"), metrics.get("pred_l2_to_gd"), metrics.get("sensitivity_cosine"),
               metrics.get("sensitivity", ""))


def reference_rows(metrics: dict) -> list[Row]:
    """GD (one step at η*; k steps at their best shared rate; k steps with a rate each, fitted on the validation
    split) and least squares, as rows."""
    rows = [Row(f"GD, 1 step at η* = {metrics['gd_eta']:.4g}", "reference", metrics["gd_loss"], metrics["gd_loss_se"],
                0.0, 0.0, 0.0, 1.0)]
    rows += [Row(f"GD, {k['steps']} step{'s' if k['steps'] > 1 else ''} at η = {k['eta']:.4g}", "reference", k["loss"],
                 k["loss_se"], k["gd_paired_diff"], k["gd_paired_se"]) for k in metrics["gd_k_steps"]]
    rows += [Row(f"GD, {k['steps']} steps at η = {', '.join(f'{e:.4g}' for e in k['etas'])} (a rate each, fitted on "
                 f"{k['tuned_on'].rsplit('/', 1)[-1]})", "reference", k["loss"], k["loss_se"], k["gd_paired_diff"],
                 k["gd_paired_se"])
             for k in metrics.get(PER_STEP_KEY, [])]
    rows.append(Row("least squares", "reference", metrics["lstsq_loss"], metrics["lstsq_loss_se"],
                    metrics["lstsq_gd_paired_diff"], metrics["lstsq_gd_paired_se"]))
    return rows


def released_on(task: str, release_root: Path | None = None) -> list[str]:
    """The released entries trained or constructed on `task`."""
    from zoo.science.registry import get_entry
    from zoo.storage.locate import read_index

    return sorted(name for name in read_index(release_root)["entries"] if get_entry(name).task == task)


def leaderboard(task: str, *, split: str = "test", add: dict | None = None, release_root: Path | None = None,
                entries: list[str] | None = None, progress=None) -> Leaderboard:
    """Rank the released entries on `task` (or `entries`), the GD and least-squares references and the
    outside models of `add` ({name: model}, anything zoo.publishing.benchmark.evaluate takes) on the frozen `split`.
    Outside models are scored first: one that breaks the contract fails before the long part."""
    from zoo.storage.loading import load
    from zoo.storage.locate import release_dir

    for name in add or {}:  # every name before anything is loaded or scored
        validate_name(name)
    spec, task_obj, frozen = load_frozen(task, split)
    batch = frozen.batch(task_obj)
    regression = task_obj.has_gd_reference  # a teacher–student task has no GD or least squares
    refs = split_references(task_obj, frozen) if regression else None
    rows = []
    for name, model in (add or {}).items():
        rows.append(model_row(name, "outside", score(as_candidate(model, name=name), task_obj, batch, refs=refs)))
    root = Path(release_root or release_dir())
    released = released_on(task, root)
    strangers = sorted(set(entries or ()) - set(released))
    if strangers:
        raise ValueError(f"{', '.join(strangers)}: not released on {task}; its released entries are {', '.join(released)}")
    for name in released if entries is None else entries:
        if progress:
            progress(name)
        candidate = checkpoint_candidate(load(root / name), name)
        rows.append(model_row(name, "released", score(candidate, task_obj, batch, refs=refs)))
    if refs is not None:
        rows += reference_rows(refs.metrics)
    return Leaderboard(task, split, frozen.name, frozen.sha256, int(frozen.x.shape[0]),
                       refs.metrics["gd_eta"] if refs else None, spec.description.strip(),
                       sorted(rows, key=lambda r: r.loss))


# ---------------------------------------------------------------- rendering
def _pm(value: float | None, se: float | None) -> str:
    return "—" if value is None else f"{value:.4g} ± {se:.2g}"


def _number(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown_table(board: Leaderboard) -> str:
    """Ranked rows; the columns against GD only where the task has GD."""
    versus_gd = board.gd_eta is not None
    head = ["#", "model", "kind", "test loss ± s.e."]
    head += ["Δ GD ± s.e. (paired)", "prediction gap to GD", "sensitivity cosine"] if versus_gd else []
    lines = ["| " + " | ".join(head) + " |", "|---:" + "|---" * (len(head) - 1) + "|"]
    for rank, r in enumerate(_checked(board), 1):
        name = f"*{_markdown_text(r.name)}*" if r.kind == "reference" else f"`{r.name}`"  # `name`: a checked name
        cells = [str(rank), name, r.kind, _pm(r.loss, r.loss_se)]
        if versus_gd:
            cosine = _number(r.cosine, ".6f") + (" (finite differences)" if r.sensitivity == "finite differences" else "")
            cells += [_pm(r.diff, r.diff_se), _number(r.pred_gap, ".3g"), cosine]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(board: Leaderboard, figure: str | None) -> str:
    from zoo.version import __version__

    if board.gd_eta is not None:
        where, versus = "at the query", (
            f"Δ GD is the paired difference from one GD step at η* = {board.gd_eta:.4g}, task by task on the same tasks, "
            "± its standard error (negative: better than that GD step); the prediction gap and the sensitivity cosine "
            "are to the same GD step (autograd for torch models, finite differences for black boxes).")
    else:
        where, versus = "at every position", "A teacher–student task has no GD or least-squares reference."
    split = (f"{board.n_tasks:,} tasks of the frozen split `{board.dataset}` (SHA-256 `{board.dataset_sha256}`), scored "
             f"by icl-zoo {__version__} (`zoo leaderboard {board.task}`). Loss: ½·MSE {where}, mean ± standard error "
             f"over tasks. {versus}")
    yours = (f"Place your own model: `zoo leaderboard {board.task} --add NAME=model.onnx` (an ONNX file, a Hub repo "
             f"holding one, or a checkpoint), or from Python `zoo.evaluate(model, task=\"{board.task}\")` for torch "
             "modules and functions; the contract is in `zoo/publishing/benchmark.py`.")
    drawn = "test loss and paired difference from GD" if board.gd_eta is not None else "test loss"
    parts = [f"# Leaderboard: `{board.task}` ({board.split} split)", "", board.description, "", split, "",
             markdown_table(board), *([f"![{drawn}]({figure})", ""] if figure else []), yours, ""]
    return "\n".join(parts)


def figure(board: Leaderboard, path: Path) -> Path:
    """Test loss with standard-error bars and, where the task has GD, the paired difference from GD."""
    import numpy as np

    from zoo.science.analysis.plots import plt, save

    rows = _checked(board)
    panels = 2 if board.gd_eta is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels + 2.5, 0.3 * len(rows) + 1.4), sharey=True, squeeze=False)
    axes = axes[0]
    for kind, colour in KIND_COLOURS.items():
        at = [i for i, r in enumerate(rows) if r.kind == kind]
        if not at:
            continue
        axes[0].errorbar([rows[i].loss for i in at], at, xerr=[rows[i].loss_se for i in at], fmt="o", ms=4, capsize=2,
                         color=colour, label=kind)
        if panels == 2:
            axes[1].errorbar([rows[i].diff for i in at], at, xerr=[rows[i].diff_se for i in at], fmt="o", ms=4,
                             capsize=2, color=colour)
    labels = [r.name.replace("$", r"\$") for r in rows]  # plain text, never mathtext
    axes[0].set_yticks(np.arange(len(rows)), labels, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xscale("log")
    axes[0].set_xlabel("test loss (½·MSE) ± s.e.")
    axes[0].legend(fontsize=8)
    if panels == 2:
        largest = max(abs(r.diff) for r in rows)
        axes[1].axvline(0, color="k", lw=0.8)
        # GD-like models sit in the linear band around 0; the rest on log scales either side
        linthresh = 10.0 ** math.floor(math.log10(max(largest * 1e-3, 1e-12)))  # a decade: its ticks sit at the band's ends
        axes[1].set_xscale("symlog", linthresh=linthresh, linscale=2)
        axes[1].set_xlim(-2 * largest, 2 * largest)
        axes[1].set_xlabel("model − GD (paired) ± s.e.")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{board.task}: {board.split} split, {board.n_tasks:,} tasks", fontsize=10)
    return save(fig, path, dpi=100)


def write(board: Leaderboard, folder: Path) -> list[Path]:
    """<task>.md and <task>.png in `folder`, each written whole under a temporary name, then renamed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, png = folder / f"{board.task}.md", folder / f"{board.task}.png"
    tmp_md, tmp_png = folder / f".{md.name}.tmp", folder / f".{board.task}.tmp.png"  # savefig reads the suffix
    try:
        figure(board, tmp_png)
        tmp_md.write_text(markdown(board, png.name))
        os.replace(tmp_png, png)
        os.replace(tmp_md, md)
    finally:
        tmp_png.unlink(missing_ok=True)
        tmp_md.unlink(missing_ok=True)
    return [md, png]


def write_leaderboards(release_root: Path | None = None, progress=None) -> list[Path]:
    """A leaderboard for every task of the release: release/leaderboards/<task>.md and .png."""
    from zoo.science.registry import get_entry
    from zoo.storage.locate import read_index, release_dir

    root = Path(release_root or release_dir())
    tasks = sorted({get_entry(name).task for name in read_index(root)["entries"]})
    written = []
    for task in tasks:
        written += write(leaderboard(task, release_root=root, progress=progress), root / FOLDER)
    return written


def leaderboard_url(task: str) -> str:
    """Where a task's leaderboard is published: the release folder of the zoo's repository."""
    from zoo.storage.card import REPO_URL

    return f"{REPO_URL}/blob/main/release/{FOLDER}/{task}.md"
