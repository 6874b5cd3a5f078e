"""`build`: turn a registry entry into a checkpoint — construct or train, evaluate, save."""

from __future__ import annotations

import copy
import sys
from contextlib import ExitStack
from pathlib import Path

import torch

from export import onnx_export
from zoo.running.train import default_device, train, training_mode
from zoo.science.constructions import construct
from zoo.science.evaluation import alignment_probe, evaluate, gd_reference
from zoo.science.models import create_model
from zoo.science.registry import Entry, get_entry, get_task_spec, with_overrides
from zoo.science.tasks.frozen import load_split
from zoo.storage.atomic import recover_folder, writing
from zoo.storage.checkpoint import Checkpoint, CheckpointError, provenance
from zoo.storage.save import not_zoo_file, save_checkpoint

TRAIN_DIR = ".train"  # resumable training state inside the output folder; never published


def save(ckpt: Checkpoint, out: str | Path, *, keep=not_zoo_file, graphs: bool = True, phase=None) -> Path:
    """The checkpoint's whole Hub repo folder, saved by the storage floor (`zoo.storage.save.save_checkpoint`)
    with the exporter's ONNX graphs (unless `graphs=False`) and the card rendered from the saved files, all in
    one staged folder swapped in whole. `zoo build`, `zoo export` and the release save this way. `phase(text)`:
    told each step as it starts."""
    return save_checkpoint(ckpt, out, keep=keep, graphs=onnx_export.export_checkpoint_graphs if graphs else None,
                           phase=phase)


def phases(progress: bool):
    """What `build` says as each step after training starts (seconds each: the evaluation, the graphs' export,
    the card's figures), on stderr beside the training bar: the CLI's stdout stays its result (`--json`)."""
    if not progress:
        return lambda text: None
    return lambda text: print(f"  {text}…", file=sys.stderr, flush=True)


def _prepare(name: str | Entry, overrides: dict | None):
    """The entry (with overrides), its task spec and task, and its frozen splits, hash-checked against the
    registry (an unregistered variant's: against their regeneration from their seeds)."""
    entry = get_entry(name) if isinstance(name, str) else name
    if overrides:
        entry = with_overrides(entry, overrides)
    spec = get_task_spec(entry.task)
    validation, test = load_split(entry.task, "validation", spec=spec), load_split(entry.task, "test", spec=spec)
    hashes = {"validation": validation.sha256, "test": test.sha256}
    return entry, spec, spec.build(), validation, test, hashes


def build(
    name: str | Entry,
    out: str | Path | None = None,
    *,
    steps: int | None = None,
    device: str | None = None,
    seed: int | None = None,
    overrides: dict | None = None,
    progress: bool = True,
    compiled: bool = False,
    model: torch.nn.Module | None = None,
    track_alignment: bool = False,
    force: bool = False,
    graphs: bool = True,
) -> Checkpoint:
    """Construct or train the entry `name` (or an Entry), evaluate it on its frozen test split,
    save it to `out` with its graphs and card, swapped in whole (`save`). An `out` that holds another run's
    checkpoint (`claim_out`) is refused before any work unless `force`: then it is replaced entirely
    (another run's training state in it discarded); this run's own is rebuilt or resumed without it.
    `overrides` replaces dotted fields first ({"arch.hidden": 16});
    `compiled` trains through torch.compile (zoo.running.train.Step: same data, same losses to rounding).
    `model`: the trained entry's `untrained_model` for this seed when the caller has built it already.
    `track_alignment`: record the blogpost's three alignment metrics against the entry's GD reference
    on the validation split at every eval step, in the history (its Figure 10); the weights are unchanged.
    `graphs=False`: no ONNX graphs in `out` (`zoo export` adds them later).
    A non-empty `out` that holds no zoo checkpoint is refused, `force` or not (`claim_out`); `out` is locked from
    the first look at it to the save (`zoo.storage.atomic.writing`): another build into it is refused meanwhile."""
    with ExitStack() as stack:
        if out is not None:
            stack.enter_context(writing(out, what="zoo build"))
        return _build(name, out, steps=steps, device=device, seed=seed, overrides=overrides, progress=progress,
                      compiled=compiled, model=model, track_alignment=track_alignment, force=force, graphs=graphs)


def _build(name, out, *, steps, device, seed, overrides, progress, compiled, model, track_alignment, force,
           graphs) -> Checkpoint:
    say = phases(progress)
    say("loading the frozen validation and test splits (built from their seeds on first use)")
    entry, spec, task, validation, test, hashes = _prepare(name, overrides)
    construction, history = None, []
    trained = entry.source.kind == "trained"
    seed = (entry.source.seed if seed is None else seed) if trained else None
    replacing = claim_out(out, entry, spec, seed=seed, force=force)
    # Replacing another run's folder keeps nothing of it: only this run's resumable state, if it trains.
    keep = (lambda n: trained and n == TRAIN_DIR) if replacing else not_zoo_file

    if not trained:
        say(f"constructing the weights ({entry.source.construction})")
        model = create_model(entry.arch, task)
        construction = construct(entry, model, task, validation.batch(task, dtype=torch.float64))
        prov = provenance(seed=None, steps=None, device="cpu", dataset_hashes=hashes)
    else:
        recipe = entry.source
        dev = torch.device(device) if device else default_device()
        model = untrained_model(entry, seed, task) if model is None else model
        construction = _initialise(entry, model, task, validation)
        if out is None:
            raise ValueError("training needs an output folder (out=...) for its resumable state")
        claim_run_dir(Path(out) / TRAIN_DIR, entry, spec, seed=seed, steps=steps or recipe.steps, force=force)
        compiled = training_mode(model, recipe, dev, compile=compiled).compiled  # eager where compiling cannot or does not pay
        result = train(
            model, task, recipe, run_dir=Path(out) / TRAIN_DIR, validation_batch=validation.batch(task),
            steps=steps, seed=seed, device=dev, progress=progress, compiled=compiled,
            probe=_alignment_probe(entry, task, construction, validation) if track_alignment else None,
        )
        history = result.history
        model.cpu()
        prov = provenance(seed=seed, steps=result.steps, device=str(dev), dataset_hashes=hashes)
        if compiled:
            prov["compiled"] = True

    return _evaluate_and_save(entry, spec, model, prov, construction, history, out, validation, test, keep, graphs,
                              phase=say)


def _alignment_probe(entry, task, construction, validation):
    """`zoo.science.evaluation.alignment_probe` against the GD the entry's card compares it with (`gd_reference`)."""
    if not task.has_gd_reference:
        raise ValueError(f"entry '{entry.name}': alignment with GD is defined for in-context regression tasks, "
                         f"not {type(task).__name__}")
    reference = gd_reference(entry, task, construction, validation.batch(task, dtype=torch.float64))
    return alignment_probe(task, validation.batch(task), **reference)


def untrained_model(entry: Entry, seed: int, task=None) -> torch.nn.Module:
    """The trained entry's model before training: its initial weights belong to the seed too."""
    torch.manual_seed(seed)
    return create_model(entry.arch, task if task is not None else get_task_spec(entry.task).build())


RUN_IDENTITY = "run.json"


def claim_out(out: str | Path | None, entry: Entry, spec, *, seed: int | None, force: bool = False) -> bool:
    """Whether `out` holds the checkpoint of another run (another entry, definition or seed), which saving
    there replaces: refused unless `force`. Without a config.json, or with this run's (a rebuild, a resumed
    training), there is nothing to replace and False is returned. Steps are not compared: `claim_run_dir`
    guards a resumed state.

    Nothing the zoo did not write is replaced, `force` or not: a folder with no config.json must be empty (or
    hold only this zoo's training state), and a config.json must be a zoo checkpoint's (`is_zoo_config`).
    A checkpoint that a killed save left renamed aside is put back first (`recover_folder`)."""
    from zoo.science.registry import definition_sha256
    from zoo.storage.manifest import CONFIG, read_json_file

    if out is None:
        return False
    out = Path(out)
    recover_folder(out)
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise CheckpointError(f"{out} is a file, not a folder; refusing to write a checkpoint there")
    config_path = out / CONFIG
    if not (config_path.exists() or config_path.is_symlink()):
        foreign = sorted(p.name for p in out.iterdir() if p.name != TRAIN_DIR) if out.is_dir() else []
        if foreign:
            shown = ", ".join(foreign[:4]) + (", …" if len(foreign) > 4 else "")
            raise CheckpointError(f"{out} is not empty ({shown}) and is not a zoo checkpoint (no config.json); "
                                  "refusing to write into it, --force or not: choose a new or empty folder")
        return False
    try:
        config = read_json_file(config_path)
    except (ValueError, OSError):  # CheckpointError: too big, not JSON
        config = None
    if not is_zoo_config(config):
        raise CheckpointError(f"{out} holds a config.json that is not a zoo checkpoint's; refusing to replace it, "
                              "--force or not (--force replaces only a zoo checkpoint): choose another folder")
    try:
        held = (config["entry"]["name"], definition_sha256(config["entry"], config["task"]),
                (config.get("provenance") or {}).get("seed"))
    except (ValueError, KeyError, TypeError, AttributeError):  # pydantic's ValidationError: a zoo checkpoint
        held = (config["entry"]["name"], None, None)  # of a definition this zoo no longer reads
    wanted = (entry.name, definition_sha256(entry.model_dump(mode="json"), spec.model_dump(mode="json")), seed)
    if held == wanted:
        return False
    if not force:
        if held[0] != entry.name:
            what = f"the checkpoint of entry '{held[0]}'"
        elif held[1] is None:
            what = f"a checkpoint of entry '{held[0]}' this zoo cannot read"
        else:
            what = f"another run of entry '{held[0]}' ({'another definition' if held[1] != wanted[1] else f'seed {held[2]}'})"
        raise CheckpointError(f"{out} already holds {what}, not this build of '{entry.name}'"
                              f"{f' (seed {seed})' if seed is not None else ''}; pass --force (force=True) to "
                              "replace the folder entirely, or choose another output folder")
    return True


def is_zoo_config(config) -> bool:
    """Whether `config` (a parsed config.json) is a zoo checkpoint's: its format, an entry with a name, a task
    and the zoo's provenance. What else a folder's config.json may be (a transformers model's, someone's
    settings) is never replaced by a zoo checkpoint."""
    return (isinstance(config, dict) and "format" in config and isinstance(config.get("entry"), dict)
            and isinstance(config["entry"].get("name"), str) and isinstance(config.get("task"), dict)
            and isinstance(config.get("provenance"), dict) and "zoo_version" in config["provenance"])


def claim_run_dir(run_dir: Path, entry: Entry, spec, *, seed: int, steps: int, members: list[int] | None = None,
                  force: bool = False) -> None:
    """Record which run a resumable training state belongs to, or refuse a state that belongs to
    another one (another entry, recipe, task, seed or step count): resuming it would save that
    run's weights under this run's name. With `force` such a state is deleted instead (start fresh).
    The record is written atomically: a kill while writing it cannot leave an unreadable one."""
    import json
    import shutil

    from zoo.science.registry import definition_sha256
    from zoo.storage.atomic import write_text

    identity = {
        "entry": entry.name,
        "definition": definition_sha256(entry.model_dump(mode="json"), spec.model_dump(mode="json")),
        "seed": seed if members is None else members,
        "steps": steps,
    }
    path = Path(run_dir) / RUN_IDENTITY
    if force and Path(run_dir).is_dir() and not _records(path, identity):
        shutil.rmtree(run_dir)  # another run's state (or one with no readable record): forced to start fresh
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            recorded = None
        if recorded != identity:
            differs = [k for k in identity if not isinstance(recorded, dict) or recorded.get(k) != identity[k]]
            raise ValueError(
                f"{run_dir} holds the training state of another run ({', '.join(differs) or 'unreadable record'} "
                f"differ: {recorded} vs {identity}); resuming it would mislabel its weights. "
                f"Delete {run_dir} to start fresh, or build into another folder.")
    elif any(Path(run_dir).glob("train_state*")):
        raise ValueError(f"{run_dir} holds a training state with no record of its run; delete {run_dir} to start fresh")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(identity, indent=1))


def read_run_record(run_dir: Path) -> dict | None:
    """The run record (`RUN_IDENTITY`: entry, definition, seed, steps) of a training folder, None when
    there is none. A corrupt one (empty, not JSON, not an object: a kill while an older version wrote
    it, a hand edit) is discarded with a warning and read as {}: its folder then starts afresh."""
    import json
    import warnings

    path = Path(run_dir) / RUN_IDENTITY
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):  # ValueError: invalid JSON or UTF-8
        record = None
    if isinstance(record, dict) and isinstance(record.get("steps"), int) and not isinstance(record["steps"], bool):
        return record
    warnings.warn(f"{path}: corrupt run record, discarded; {Path(run_dir)} is rebuilt from the start", stacklevel=2)
    return {}


def _records(path: Path, identity: dict) -> bool:
    """Whether the run record `path` holds `identity`."""
    import json

    try:
        return json.loads(path.read_text()) == identity
    except (OSError, ValueError):  # absent, unreadable, not JSON (UnicodeDecodeError is a ValueError)
        return False


def _evaluate_and_save(entry, spec, model, prov, construction, history, out, validation, test,
                       keep=not_zoo_file, graphs: bool = True, phase=None) -> Checkpoint:
    say = phase or (lambda text: None)
    task = spec.build()
    say(f"evaluating on the frozen test split ({len(test.x):,} tasks) beside the GD reference")
    reference = gd_reference(entry, task, construction, validation.batch(task, dtype=torch.float64))
    metrics = evaluate(model, task, test.batch(task), **reference)
    _warn_if_diverged(entry, metrics)
    if construction and "eta" in construction:
        metrics["construction_eta"] = construction["eta"]
    ckpt = Checkpoint(model=model, entry=entry, task_spec=spec, provenance=prov,
                      construction=construction, metrics=metrics, history=history)
    if out is not None:
        save(ckpt, out, keep=keep, graphs=graphs, phase=say)  # graphs and card, swapped in whole
    return ckpt


def _warn_if_diverged(entry, metrics: dict) -> None:
    """A finite but absurd test loss (e.g. `--set source.lr=1e3`) is saved, but never without a word."""
    import math
    import warnings

    loss, reference = metrics.get("test_loss"), metrics.get("gd_loss")
    if loss is None or not math.isfinite(loss):
        raise ValueError(f"entry '{entry.name}': the test loss is {loss}; refusing to save a checkpoint")
    if reference and loss > 10 * reference:
        warnings.warn(f"entry '{entry.name}': test loss {loss:.4g} is {loss / reference:.3g}× the {metrics.get('gd_steps', 1)}-step "
                      "GD loss: the run probably diverged or did not train (check the recipe's lr)", stacklevel=3)


def _initialise(entry, model, task, validation) -> dict | None:
    """Apply `source.init` (a construction) before training; the parameters it sets may then be frozen."""
    if not entry.source.init:
        return None
    from zoo.science.registry import initial_construction

    with torch.no_grad():
        start = copy.deepcopy(model).double()
        info = construct(initial_construction(entry), start, task, validation.batch(task, dtype=torch.float64))
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.to(dtypes[k]) for k, v in start.state_dict().items()})
    return {**info, "init": entry.source.init, "frozen": list(entry.source.freeze)}


def build_ensemble(
    name: str | Entry,
    seeds: list[int],
    outs: list[str | Path],
    *,
    run_dir: str | Path,
    steps: int | None = None,
    device: str | None = None,
    overrides: dict | None = None,
    progress: bool = True,
    compiled: bool = False,
    first: torch.nn.Module | None = None,
    track_alignment: bool = False,
    force: bool = False,
    graphs: bool = True,
) -> list[Checkpoint]:
    """Train one member per seed in one batched computation (zoo/running/ensemble.py), then evaluate
    and save each as an ordinary checkpoint in `outs[i]`; `run_dir` holds the resumable state.
    `compiled`: torch.compile the step where it is not replayed as a CUDA graph already.
    `first`: the first seed's `untrained_model` when the caller has built it already.
    `track_alignment`, `graphs`: as in `build`, for every member. `force`: as in `build`, for each of `outs`
    and for `run_dir`."""
    with ExitStack() as stack:  # every member's folder and the training state's, locked as in `build`
        for folder in [*outs, run_dir]:
            stack.enter_context(writing(folder, what="zoo build"))
        return _build_ensemble(name, seeds, outs, run_dir=run_dir, steps=steps, device=device, overrides=overrides,
                               progress=progress, compiled=compiled, first=first, track_alignment=track_alignment,
                               force=force, graphs=graphs)


def _build_ensemble(name, seeds, outs, *, run_dir, steps, device, overrides, progress, compiled, first,
                    track_alignment, force, graphs) -> list[Checkpoint]:
    from zoo.running.ensemble import train_ensemble

    entry, spec, task, validation, test, hashes = _prepare(name, overrides)
    if entry.source.kind != "trained":
        raise ValueError(f"entry '{entry.name}' is constructed; only trained entries form ensembles")
    dev = torch.device(device) if device else default_device()
    # Refused before any training; an out replaced keeps nothing of the other run (the state is in run_dir).
    keeps = [(lambda n: False) if claim_out(out, entry, spec, seed=seed, force=force) else not_zoo_file
             for seed, out in zip(seeds, outs)]

    constructions = []  # what `source.init` did: the same for every member
    prebuilt = [] if first is None else [first]

    def make_member():  # called after torch.manual_seed(seed), as `untrained_model` draws the first
        model = prebuilt.pop() if prebuilt else create_model(entry.arch, task)
        constructions.append(_initialise(entry, model, task, validation))
        return model

    probe_model = first if first is not None else create_model(entry.arch, task)
    compiled = training_mode(probe_model, entry.source, dev, members=len(seeds), compile=compiled).compiled  # not with a CUDA graph
    probe = None
    if track_alignment:  # every member starts from the same `source.init`, so one reference serves all
        init = _initialise(entry, create_model(entry.arch, task), task, validation) if entry.source.init else None
        probe = _alignment_probe(entry, task, init, validation)
    claim_run_dir(Path(run_dir), entry, spec, seed=seeds[0], steps=steps or entry.source.steps, members=list(seeds),
                  force=force)
    result = train_ensemble(make_member, task, entry.source, seeds, run_dir=Path(run_dir),
                            validation_batch=validation.batch(task), steps=steps, device=dev, progress=progress,
                            compiled=compiled, probe=probe)
    construction = constructions[0] if constructions else None
    ckpts = []
    for i, (seed, model, out, keep) in enumerate(zip(seeds, result.models, outs, keeps)):
        history = [{k: v[i] if isinstance(v, list) else v for k, v in r.items()} for r in result.history]  # member i's row
        prov = provenance(seed=seed, steps=result.steps, device=str(dev), dataset_hashes=hashes)
        prov["ensemble"] = {"members": len(seeds), "seeds": list(seeds)}
        if compiled:
            prov["compiled"] = True
        ckpts.append(_evaluate_and_save(entry, spec, model.cpu(), prov, construction, history, out, validation, test,
                                        keep, graphs, phase=phases(progress)))
    return ckpts

