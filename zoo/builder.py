"""`build`: turn a registry entry into a checkpoint — construct or train, evaluate, save."""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.checkpoint import Checkpoint, provenance
from zoo.constructions import construct
from zoo.evaluate import evaluate
from zoo.models import create_model
from zoo.registry import get_entry, get_task_spec
from zoo.tasks.frozen import load_split
from zoo.train import default_device, train

TRAIN_DIR = ".train"  # resumable training state inside the output folder; never published


def build(
    name: str,
    out: str | Path | None = None,
    *,
    steps: int | None = None,
    device: str | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> Checkpoint:
    """Construct or train the entry `name`, evaluate it on its frozen test split, save it to `out`."""
    entry = get_entry(name)
    spec = get_task_spec(entry.task)
    task = spec.build()
    validation, test = load_split(entry.task, "validation"), load_split(entry.task, "test")
    hashes = {"validation": validation.sha256, "test": test.sha256}
    construction, history = None, []

    if entry.source.kind == "constructed":
        model = create_model(entry.arch, task)
        construction = construct(entry, model, task, validation.batch(task, dtype=torch.float64))
        prov = provenance(seed=None, steps=None, device="cpu", dataset_hashes=hashes)
    else:
        recipe = entry.source
        seed = recipe.seed if seed is None else seed
        dev = torch.device(device) if device else default_device()
        torch.manual_seed(seed)  # the initial weights belong to the seed too
        model = create_model(entry.arch, task)
        if out is None:
            raise ValueError("training needs an output folder (out=...) for its resumable state")
        result = train(
            model, task, recipe, run_dir=Path(out) / TRAIN_DIR, validation_batch=validation.batch(task),
            steps=steps, seed=seed, device=dev, progress=progress,
        )
        history = result.history
        model.cpu()
        prov = provenance(seed=seed, steps=result.steps, device=str(dev), dataset_hashes=hashes)

    metrics = evaluate(model, task, test.batch(task))
    if construction and "eta" in construction:
        metrics["construction_eta"] = construction["eta"]
    ckpt = Checkpoint(model=model, entry=entry, task_spec=spec, provenance=prov,
                      construction=construction, metrics=metrics, history=history)
    if out is not None:
        ckpt.save_pretrained(out)
    return ckpt
