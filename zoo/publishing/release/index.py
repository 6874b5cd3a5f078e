"""The release index: one row per released entry (steps run vs recipe, device, commit, hashes, checks
against the entry's `expected` values, verdict), index.json and the INDEX.md page rendered from it, and
whether a released folder is current (built from the registry's definition of its entry)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from zoo.publishing.release.plan import entry_fingerprint
from zoo.science.expected import (
    PAIRED_KEYS,
    VERDICTS,
    check,
    claim_text,
    measured_text,
    measurements,
    needs_paired,
    verdict,
)
from zoo.science.models import FAMILY_OF_TYPE
from zoo.science.registry import default_registry, definition_sha256, get_entry, unknown_entry_error
from zoo.storage import locate
from zoo.storage.card import device_words
from zoo.storage.checkpoint import commit_with_sources, read_checkpoint
from zoo.storage.locate import INDEX_JSON, INDEX_MD, ReleaseError, verify_folder
from zoo.storage.manifest import CONFIG, CheckpointError, sha256_file, verify_files


def index_row(name: str, folder: Path, *, build_seconds: float | None = None, steps_per_second: float | None = None,
              remeasured: dict | None = None) -> dict:
    """The index row of released folder `folder`. `remeasured`: what a claim needs beyond its
    eval_results.json (zoo.science.expected.measurements: the paired gap to GD), measured from the
    checkpoint on its frozen test split here when not given."""
    entry = get_entry(name)
    config = json.loads((folder / CONFIG).read_text())
    metrics = json.loads((folder / "eval_results.json").read_text())
    prov = config.get("provenance", {})
    if remeasured is None:
        remeasured = {}
        if needs_paired(entry) and not all(k in metrics for k in PAIRED_KEYS):
            remeasured = measurements(entry, read_checkpoint(folder), metrics)
    checks = check(entry, {**metrics, **remeasured})
    row = {
        "entry": name,
        "arch": entry.arch.type,
        "family": FAMILY_OF_TYPE[entry.arch.type].name,  # the Family (zoo/science/models/) that builds that arch type
        "paper": entry.paper,
        "paper_file": Path(entry.file).stem,
        "source": entry.source.kind,
        "steps": prov.get("steps"),
        "recipe_steps": entry.source.steps if entry.source.kind == "trained" else None,
        "device": prov.get("device"),
        "threads": prov.get("threads"),
        "seed": prov.get("seed"),
        "build_seconds": round(build_seconds, 1) if build_seconds is not None else None,
        "steps_per_second": round(steps_per_second, 1) if steps_per_second else None,
        "test_loss": metrics.get("test_loss"),
        "gd_loss": metrics.get("gd_loss"),
        "gd_steps": metrics.get("gd_steps"),
        "lstsq_loss": metrics.get("lstsq_loss"),
        "checks": [c.as_dict() for c in checks],
        "verdict": verdict(checks),
        "remeasured": remeasured,  # measured at build/refresh time from the checkpoint, beyond eval_results.json
        "deviations": [d.what for d in entry.deviation],  # declared departures (the card has them in full)
        "commit": prov.get("git_commit"),
        "fingerprint": definition_sha256(config["entry"], config["task"]),  # what the weights were built from
        "files": {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()},
    }
    if prov.get("device_name"):  # the GPU's or the CPU's model, where the checkpoint records it (newer builds)
        row["device_name"] = prov["device_name"]
    if sources := commit_with_sources(row["commit"]):  # a build from uncommitted code: the commit holding that code
        row["sources_commit"] = sources
    row["note"] = shortfall_note(row)
    return row


def run_summary(row: dict) -> str:
    """How a released entry was made, in one line (steps run vs recipe, device)."""
    if row["source"] != "trained":
        return "constructed analytically (no training)"
    short = row["steps"] < row["recipe_steps"]
    return (f"trained {row['steps']:,} of the recipe's {row['recipe_steps']:,} steps on {device_words(row)}"
            + (" — a shorter run than the paper's recipe" if short else " (the full recipe)"))


def shortfall_note(row: dict) -> str:
    """Why a trained entry falls short (or has no paper value) and what run would close it."""
    if row["source"] != "trained":
        misses = row["verdict"] in ("falls short", "differs from the reference")
        return "a construction that misses its expected value: a defect" if misses else ""
    short_run = row["steps"] is not None and row["recipe_steps"] and row["steps"] < row["recipe_steps"]
    gap = ""
    if row.get("gd_loss") and row.get("test_loss") is not None:
        steps = row.get("gd_steps") or 1
        # k > 1: the release's GD column shares one rate over the k steps; a model with a rate of its own per step
        # (a layer each) is compared with k steps at a rate each in `zoo eval` and the leaderboards
        comparator = f"{steps}-step GD" + ("" if steps == 1 else " at one shared rate (a rate each: `zoo eval`)")
        gap = f"test loss {100 * (row['test_loss'] / row['gd_loss'] - 1):+.1f}% vs {comparator}"
    if short_run:
        run = (f"shorter run: {row['steps']:,} of the recipe's {row['recipe_steps']:,} steps on {device_words(row)}; "
               f"the recipe-length run is `zoo release build --only {row['entry']} --force` on a GPU")
        return "; ".join(x for x in (gap, run) if x)
    return gap


def is_adoptable(folder: Path, name: str) -> bool:
    """Whether `folder` is a complete checkpoint of entry `name`'s current definition (a build that stopped
    before writing its index row): its row is written from it instead of building it again."""
    try:
        config = verify_files(folder).config
        return definition_sha256(config["entry"], config["task"]) == entry_fingerprint(name)
    except (CheckpointError, OSError, ValidationError):  # a folder of another schema is rebuilt, not adopted
        return False


def is_current(root: Path, row: dict | None) -> bool:
    """Whether index row `row` is released in `root`, its files as the row hashes them, built from the
    registry's current definition of its entry."""
    if row is None or not (root / row["entry"] / CONFIG).is_file():
        return False
    try:
        verify_folder(root / row["entry"], row)
    except ReleaseError:
        return False
    return row.get("fingerprint") == entry_fingerprint(row["entry"])


def write_index(root: Path, index: dict) -> None:
    """index.json (written whole, then renamed into place) and the INDEX.md page rendered from it."""
    tmp = root / (INDEX_JSON + ".tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / INDEX_JSON)
    (root / INDEX_MD).write_text(index_markdown(index))


def _fmt(x, spec=".4g") -> str:
    return "" if x is None else format(x, spec)


def _check_cell(c: dict) -> str:
    word = "paper" if c.get("source") == "paper" else "reference" if c.get("source") == "reference" else "stated"
    kind = c.get("kind", "within")  # a row written before claims had kinds: `zoo release refresh` rewrites it
    status = c.get("status", "meets" if c["meets"] else "falls short")
    cell = (f"{c['metric']} ({word}) {claim_text(kind, c.get('value', c.get('paper')), c['tolerance'])} → "
            f"{measured_text(kind, c['measured'])} ({c['off_by']}): {status}")
    return cell.replace("|", "\\|")  # a table cell


def _short_runs_sentence(short_runs: int) -> str:
    """What the index says of trained entries that ran less than their recipe."""
    if short_runs == 0:
        return "Every trained entry ran its whole recipe (steps column)."
    if short_runs == 1:
        return "1 trained entry holds a **shorter run than its recipe** (steps column): its numbers are those of the shorter run."
    return (f"{short_runs} trained entries hold a **shorter run than their recipe** (steps column): their numbers are "
            "those of the shorter run.")


def index_markdown(index: dict) -> str:
    """INDEX.md: the release's table, one row per entry, and the paper's words for every value checked."""
    rows = list(index["entries"].values())
    current = {r["entry"]: r["fingerprint"] == entry_fingerprint(r["entry"]) for r in rows
               if r["entry"] in default_registry().entries}
    missing = sorted(set(default_registry().entries) - {r["entry"] for r in rows})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    short_runs = sum(1 for r in rows if r["source"] == "trained" and r["steps"] < r["recipe_steps"])
    departing = sum(1 for r in rows if r.get("deviations"))
    lines = [
        f"# icl-zoo release {index['version']}",
        "",
        "Generated by `zoo release build` from the registry (`zoo/science/entries/*.toml`); do not edit by hand.",
        "Every folder beside this file is one entry's Hub repo: `zoo.load(\"<entry>\")` loads it offline,",
        "`zoo hub serve` serves it as `icl-zoo/<entry>` at tag `" + index["version"] + "`.",
        "",
        (f"{len(rows)} entries released ({len(missing)} registry entries missing). Verdicts against numbers the papers "
         f"print (each quoted below the table): {counts['meets']} meet, {counts['falls short']} fall short"
         + (f", {counts['meets where checkable']} meet where checkable (a claim the zoo cannot measure on that "
            "checkpoint). " if counts["meets where checkable"] else ". ")
         + f"Checked only against a reference the zoo computes (a closed form or a construction, not a paper verdict): "
         f"{counts['matches the reference']} match, {counts['differs from the reference']} differ. "
         f"{counts['no paper value']} have no expected value. "
         + _short_runs_sentence(short_runs)
         + f" {departing} entries declare departures from the paper's setting or recipe "
         "(departures column; each card gives what the paper says, what the zoo does and why)."),
        "",
        ("A commit marked *-dirty* was built from uncommitted code; `= <commit>` names the later commit whose sources "
         "hash to the recorded difference (`sources_commit` in index.json): the code to rebuild it from. "
         "A commit marked *stale* was built from an entry's arch, recipe or task data that has since changed: "
         "`zoo release build` rebuilds it. Expected values, tolerances, notes and departures are not part of "
         "what a build is made from: `zoo release refresh` re-renders the cards and this index after a change to them."),
        "",
        ("| entry | arch (family) | paper | source | steps run / recipe | device | test loss | GD ref (k steps) "
         "| expected value (source, claim) → measured | verdict | departures | note | commit |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    quotes = []
    for r in sorted(rows, key=lambda r: (r["paper_file"], r["entry"])):
        steps = f"{r['steps']:,} / {r['recipe_steps']:,}" if r["source"] == "trained" else "—"
        device = device_words(r) + (f" ({r['threads']} thr)" if r.get("threads") else "")
        checks = "<br>".join(_check_cell(c) for c in r["checks"]) or "—"
        commit = r["commit"] or "unknown"
        commit = (f"`{commit[:10]}" + ("-dirty" if "-dirty" in commit else "") + "`"
                  + (f" = `{r['sources_commit'][:10]}`" if r.get("sources_commit") else "")
                  + ("" if current.get(r["entry"], True) else " *stale*"))
        gd = f"{_fmt(r['gd_loss'])} ({r['gd_steps']})" if r.get("gd_loss") is not None else "—"
        departures = "; ".join(r.get("deviations") or []) or "—"
        lines.append(f"| [{r['entry']}]({r['entry']}/README.md) | `{r.get('arch', r['family'])}` ({r['family']}) | {r['paper']} | {r['source']} | {steps} | "
                     f"{device} | {_fmt(r['test_loss'])} | {gd} | {checks} | **{r['verdict']}** | {departures} | {r['note']} | {commit} |")
        quotes += [f"- `{r['entry']}` {c['metric']}: {c['section']}: “{c['quote']}”"
                   + (f" (“{c['paper_claim']}”)" if c.get("paper_claim") else "") for c in r["checks"] if c.get("source") == "paper"]
    if quotes:
        lines += ["", "## The paper values checked", "", "Every number graded *meets* / *falls short* above, in the paper's words:", "", *quotes]
    if missing:
        lines += ["", "Not yet released: " + ", ".join(f"`{m}`" for m in missing)]
    lines += ["", "File hashes (SHA-256) of every released file are in [`index.json`](index.json); loading verifies them.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- resolve
def released_folder(name: str, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """The folder of the released checkpoint of registry entry `name` (zoo.storage.locate.released_folder)."""
    if name not in default_registry().entries:
        raise unknown_entry_error(name)
    return locate.released_folder(name, revision=revision, endpoint=endpoint)


def resolve(path_or_repo: str | Path, *, revision: str | None = None, endpoint: str | None = None) -> Path:
    """A checkpoint folder from a local folder, a Hub repo id `ORG/NAME` or a bare registry entry name."""
    return locate.resolve(path_or_repo, revision=revision, endpoint=endpoint, names=default_registry().entries,
                          unknown=unknown_entry_error)

