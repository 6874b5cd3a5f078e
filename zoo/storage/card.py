"""Model cards: huggingface_hub ModelCard/ModelCardData/EvalResult rendered from model_cards/."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from zoo.science import registry  # looked up at call time: a test's registry replaces the default one
from zoo.science.analysis import plots
from zoo.science.expected import check, measurements, verdict
from zoo.science.metrics import METRICS
from zoo.science.models import FAMILY_OF_TYPE
from zoo.storage.locate import ORG
from zoo.storage.locate import VERSION as RELEASE_TAG  # the tag every released model and dataset repo carries
from zoo.storage.manifest import CARD_MARKER  # noqa: F401  (cli's publish asks whether a README.md is a generated card)

REPO_URL = "https://github.com/icl-zoo/icl-zoo"
ONNX_TOLERANCE = 1e-3  # relative: the card's onnxruntime snippet re-scores test_loss to this (fp32 kernels differ) ...
ROUNDING_FACTOR = 3  # ... plus this many times the model's own float32 rounding (evaluation.float32_rounding)


def snippet_tolerance(ckpt, split=None) -> tuple[float, float]:
    """(± in loss units, the model's float32 rounding) to which the card's ONNX Runtime snippet re-scores its test
    loss: ONNX_TOLERANCE of the loss, plus ROUNDING_FACTOR × how far float32 rounding alone moves this model's
    loss on the test split (torch's fp32 number on the card and ONNX Runtime's each sit within about that of the
    exact one). For most models the first term is all; the LSTM ≈ LSA construction and the exact constructions
    whose loss is rounding (~1e-14) need the second."""
    from zoo.science.evaluation import float32_rounding
    from zoo.science.tasks.frozen import load_split

    split = split if split is not None else load_split(ckpt.entry.task, "test", spec=ckpt.task_spec)
    rounding = float32_rounding(ckpt.model, ckpt.task, split.batch(ckpt.task))
    return ONNX_TOLERANCE * ckpt.metrics["test_loss"] + ROUNDING_FACTOR * rounding, rounding
METRIC_NAMES = {m.key: m.label for m in METRICS if m.group != "reference"}  # a card reports the model's own numbers


def templates_dir() -> Path:
    here = Path(__file__).parents[1]  # the package folder, zoo/
    for candidate in (here / "_model_cards", here.parent / "model_cards"):  # wheel, then source tree
        if (candidate / "card.md.j2").exists():
            return candidate
    raise FileNotFoundError("model card templates not found (model_cards/card.md.j2)")


def _papers() -> dict:
    return tomllib.loads((templates_dir() / "papers.toml").read_text())


def _paper(entry) -> dict:
    """What the entry's file cites: its own `[paper]` table (zoo/science/entries/<file>.toml), else the table of
    model_cards/papers.toml named by the file's stem."""
    own = registry.default_registry().papers.get(entry.file)
    return own.model_dump(exclude_none=True) if own is not None else _papers().get(Path(entry.file).stem, {})


def prose(entry) -> str:
    """What the architecture is (its family's prose), then the setting of the paper file that declares the entry."""
    setting = _paper(entry).get("prose", "")
    return "\n\n".join(part.strip() for part in (FAMILY_OF_TYPE[entry.arch.type].card, setting) if part.strip())


def citation(entry) -> str:
    return _paper(entry).get("citation", "").strip()


def paper_links(entry) -> list[dict]:
    """The papers an entry's `paper` field names: {title, href, arxiv} each (papers.toml's `paper_links`,
    and the links of its file's own `[paper]` table, which win for the same word)."""
    links = []
    for word, link in {**_papers().get("paper_links", {}), **_paper(entry).get("links", {})}.items():
        if word in entry.paper:
            href = link.get("url") or f"https://arxiv.org/abs/{link['arxiv']}"
            links.append({"title": link["title"], "href": href, "arxiv": link.get("arxiv")})
    return links


def _is_registered(entry) -> bool:
    """Does the registry hold an entry of this name with the same definition (arch, source, task)?"""
    registered = registry.default_registry().entries.get(entry.name)
    return registered is not None and (registered.arch, registered.source, registered.task) == (entry.arch, entry.source, entry.task)


def _registered(entry):
    """The registry's entry of the same name and definition (its current documentation), else `entry`."""
    return registry.default_registry().entries[entry.name] if _is_registered(entry) else entry


def device_words(record: dict) -> str:
    """The device a run used, with the accelerator's name where one was recorded: "cuda (NVIDIA H100 80GB HBM3)".
    A CPU stays "cpu" (its model is in the record, not in the words)."""
    name, device = record.get("device_name"), f"{record.get('device')}"
    return device + (f" ({name})" if name and device != "cpu" else "")


def run_line(ckpt) -> str:
    """One sentence on how the weights came to be, saying plainly when a run is shorter than its recipe."""
    src, p = ckpt.entry.source, ckpt.provenance
    if src.kind == "constructed":
        return "Constructed analytically, no training: the weights are the construction itself."
    steps, where = p.get("steps"), device_words(p) + (f", {p['threads']} thread(s)" if p.get("threads") else "")
    if steps is not None and steps < src.steps:
        line = (f"**A shorter run than the paper's recipe:** trained {steps:,} of the recipe's {src.steps:,} steps on {where} "
                f"(seed {p.get('seed')}). The numbers on this card are this run's, not the recipe's.")
    else:
        line = f"Trained for the entry's full recipe, {src.steps:,} steps, on {where} (seed {p.get('seed')})."
    line += (" The recipe is the zoo's: its departures from the paper's are declared below."
             if _registered(ckpt.entry).deviation else " The recipe is the paper's, as far as the paper states one.")
    if skipped := sum(row.get("skipped", 0) for row in ckpt.history):
        line += (f" {skipped:,} of its steps were skipped, with no update, for a loss or gradient that overflowed"
                 f" float32 (the recipe allows {src.max_skipped_steps:,}).")
    return line


def task_kind(spec) -> tuple[str, str]:
    """(model-index task type, task name) of a task spec: what the model is asked to do."""
    if getattr(spec, "kind", None) == "lsa_teacher":
        return "teacher-student-regression", f"Imitating a causal linear self-attention teacher (d = {spec.d})"
    if getattr(spec, "target", "linear") == "sine":
        return "in-context-regression", "In-context sine-wave regression"
    return "in-context-regression", "In-context linear regression"


def dataset_repo_of(entry, dataset_repo: str | None = None, dataset_revision: str | None = None) -> tuple[str, str]:
    """(repo, revision) of the frozen splits a card scores on: `icl-zoo/<task>` at the release's tag unless
    the caller names another repo (then its revision, or "main")."""
    if dataset_repo is None or dataset_repo == f"{ORG}/{entry.task}":
        return f"{ORG}/{entry.task}", dataset_revision or RELEASE_TAG
    return dataset_repo, dataset_revision or "main"


def base_model(entry) -> str | None:
    """The released constructed entry a trained one starts from (`source.init`), as a repo id: its weights are
    that checkpoint's, trained further (the Hub's `base_model` with `base_model_relation: finetune`). The same
    architecture first; None where the entry has no `init` or the registry holds no such entry."""
    src = entry.source
    if src.kind != "trained" or not src.init:
        return None
    return _constructed_on_task(entry, lambda other: other.source.construction == src.init)


def teacher_model(entry) -> str | None:
    """The released entry that realises the teacher a student of a teacher task imitates, as a repo id: a
    student is trained from random weights on the teacher's outputs, so it is no fine-tune of it (the card's
    metadata says `teacher`, not `base_model`). None for other entries."""
    if entry.source.kind != "trained" or getattr(get_task_spec_of(entry), "kind", None) != "lsa_teacher":
        return None
    return _constructed_on_task(entry, lambda other: True)


def _constructed_on_task(entry, wanted) -> str | None:
    found = sorted((o for o in registry.default_registry().entries.values()
                    if o.source.kind == "constructed" and o.task == entry.task and wanted(o)),
                   key=lambda o: (o.arch != entry.arch, o.name))
    return f"{ORG}/{found[0].name}" if found else None


def get_task_spec_of(entry):
    try:
        return registry.get_task_spec(entry.task)
    except KeyError:
        return None


def card_data(ckpt, dataset_repo: str | None = None, dataset_revision: str | None = None) -> ModelCardData:
    entry, m = ckpt.entry, ckpt.metrics
    dataset, revision = dataset_repo_of(entry, dataset_repo, dataset_revision)
    task_type, task_name = task_kind(ckpt.task_spec)
    results = [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=dataset,
            dataset_name=entry.task,
            dataset_split="test",
            dataset_revision=revision,
            metric_type=key,
            metric_name=label,
            metric_value=float(m[key]),
        )
        for key, label in METRIC_NAMES.items()
        if key in m
    ]
    arxiv = sorted({f"arxiv:{link['arxiv']}" for link in paper_links(entry) if link.get("arxiv")})
    registered = _registered(entry)
    base, teacher = base_model(registered), teacher_model(registered)
    # No pipeline_tag: the Hub's widgets take a table row, an image or text, and these models take a whole
    # prompt of (x, y) examples as one float tensor; "tabular-regression" showed a form that cannot call them.
    return ModelCardData(
        library_name="icl-zoo",
        license="apache-2.0",
        tags=["in-context-learning", "icl-zoo", "onnx", "safetensors", entry.arch.type, entry.source.kind, entry.task, *arxiv],
        datasets=[dataset],
        base_model=base,
        base_model_relation="finetune" if base else None,  # trained on from the constructed checkpoint's weights
        teacher=teacher,  # a student imitates this released model's outputs; it is not derived from its weights
        model_name=entry.name,
        eval_results=results or None,
    )


def _listed_files(folder: Path) -> dict:
    """The files config.json records with a hash (the ones a reader may be pointed to)."""
    try:
        return json.loads((folder / "config.json").read_text()).get("files", {})
    except (OSError, ValueError):
        return {}


def expected_column(entry) -> dict:
    """metric key → the entry's expected value for a card's table, with its source ("4.97e-08, at
    most (paper)"): every number a card compares with comes from the registry, none from the template."""
    out = {}
    for key, exp in entry.expected.items():
        if exp.kind == "paired_gd" and exp.source == "reference":
            text = f"= one GD step, paired (closed form {exp.value:.3g})"
        elif exp.kind == "paired_gd":
            text = f"{exp.value:.3g} (GD {exp.gd_value:.3g})"
        else:
            text = {"at_most": "≤ ", "at_least": "≥ "}.get(exp.kind, "") + f"{exp.value:.3g}"
        out[key] = f"{text} ({exp.source or 'stated'})"
    return out


def draw_figures(ckpt, folder: Path) -> list[dict]:
    """The card's figures, drawn into `folder` from the checkpoint's own data: the loss curve, the alignment
    with GD during training, loss against position, the family's weight matrices (each where it applies)."""
    entry, m = ckpt.entry, ckpt.metrics
    figures = []
    if ckpt.history:
        plots.loss_curve(ckpt.history, folder / "loss_curve.png", gd_loss=m.get("gd_loss"),
                         gd_steps=m.get("gd_steps", 1), title=entry.name)
        figures.append({"file": "loss_curve.png", "alt": "training and validation loss vs steps, with the one-step-GD loss"})
    if any("pred_l2_to_gd" in h for h in ckpt.history):
        plots.alignment_curve(ckpt.history, folder / "alignment_curve.png", gd_steps=m.get("gd_steps", 1),
                              title=f"{entry.name}: alignment with GD during training")
        figures.append({"file": "alignment_curve.png",
                        "alt": "prediction and gradient L2 errors to GD and the gradient cosine vs steps (validation)"})
    if "position_loss" in m:
        plots.position_curve(m, folder / "loss_vs_position.png", title=f"{entry.name}: loss against position (test split)")
        figures.append({"file": "loss_vs_position.png", "alt": "test loss of the prediction after t examples, with GD, online GD and least squares on the prefix"})
    weights = FAMILY_OF_TYPE[entry.arch.type].weights
    matrices = weights.matrices(ckpt.model) if weights is not None else None
    if matrices is not None:
        plots.weight_matrices(matrices, folder / "weights.png", title=f"{entry.name}: {weights.title}")
        figures.append({"file": "weights.png", "alt": weights.alt})
    return figures


def summarize_source(ckpt) -> str:
    """How the weights were made, in one line: the construction and its hyper-parameters, or the training run."""
    src = ckpt.entry.source
    if src.kind == "constructed":
        extra = ", ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}" for k, v in (ckpt.construction or {}).items())
        return f"constructed (`{src.construction}`; {extra})"
    p = ckpt.provenance
    summary = (f"trained for {p.get('steps')} steps on {device_words(p)} (seed {p.get('seed')}): {'AdamW' if src.optimizer == 'adamw' else 'Adam + L2'} lr {src.lr:g}"
               f" ({src.schedule}), batch {src.batch_size}, weight decay {src.weight_decay:g}; fresh tasks every step")
    if src.init:
        summary += (f"; started from the `{src.init}` construction (η = {(ckpt.construction or {}).get('eta', 0):.6g})"
                    + (f" with {', '.join(f'`{f}`' for f in src.freeze)} frozen" if src.freeze else ""))
    return summary


def write_card_and_figures(ckpt, folder: Path, *, repo_id: str | None = None,
                           dataset_repo: str | None = None, dataset_revision: str | None = None,
                           extra_metrics: dict | None = None) -> Path:
    """Render the model card and its figures into `folder`. `extra_metrics`: measurements a claim
    needs beyond eval_results.json (zoo.science.expected.measurements), when the caller already has them."""
    folder = Path(folder)
    entry, m = ckpt.entry, ckpt.metrics
    figures = draw_figures(ckpt, folder)
    source_summary = summarize_source(ckpt)
    a = entry.arch
    arch_summary = f"`{a.type}` — " + ", ".join(f"{k}={v}" for k, v in a.model_dump().items() if k != "type")
    # the registry's entry of the same weights' definition (arch, source, task), not a variant: its current
    # documentation, expected values and declared departures (they may have changed since the build)
    current = _registered(entry)
    released = _is_registered(entry)  # a registry entry's card names it, not the folder it was saved in
    if extra_metrics is None:  # a claim eval_results.json cannot answer (the paired gap to GD): measured here
        extra_metrics = measurements(current, ckpt)
    checks = check(current, {**m, **extra_metrics})
    load_name = repo_id or (entry.name if released else folder.name)
    listed = _listed_files(folder)
    data_repo, data_revision = dataset_repo_of(entry, dataset_repo, dataset_revision)
    card = ModelCard.from_template(
        card_data(ckpt, dataset_repo, dataset_revision),
        template_path=str(templates_dir() / "card.md.j2"),
        entry=current,
        task=ckpt.task_spec,
        metrics=m,
        provenance=ckpt.provenance,
        figures=figures,
        arch_summary=arch_summary,
        source_summary=source_summary,
        expected=expected_column(current),
        family_prose=prose(entry),
        citation=citation(entry),
        repo_id=repo_id or f"icl-zoo/{entry.name}",
        load_name=load_name,
        marker=CARD_MARKER,
        checks=checks,
        verdict=verdict(checks),
        run_line=run_line(ckpt),
        paper_links=paper_links(entry),
        repo_url=REPO_URL,
        streaming="model_step.onnx" in listed,
        chunk_graph="model_chunk.onnx" in listed,
        deviations=current.deviation,
        paper_recipe=current.paper_recipe,
        dataset_repo=data_repo,
        dataset_revision=data_revision,
        layout=getattr(ckpt.task_spec, "layout", None),
        readout=ckpt.task.readout,
        tolerance=snippet_tolerance(ckpt),
        relative_tolerance=ONNX_TOLERANCE,
        rounding_factor=ROUNDING_FACTOR,
    )
    card.save(folder / "README.md")
    return folder / "README.md"
