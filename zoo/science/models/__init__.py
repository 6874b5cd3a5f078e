"""Model families, one file each: its model, its arch config schema, its `build`, its analytic
constructions with their applicability rules and its card prose (`FAMILY` at the end of the file).

Adding a family is two new files: zoo/science/models/<family>.py ending with `FAMILY = Family(...)` (it is
found here; its constructions declare their knobs, which the registry validates), and
zoo/science/entries/<family>.toml with its entries and the `[paper]` table its cards cite (README, "Families").
"""

from __future__ import annotations

import importlib
import pkgutil

import torch

from zoo.science.models.base import ConstructionRule, Family, NotRecurrentError, ZooModel
from zoo.science.models.fast_weight import FastWeightRNN
from zoo.science.models.gated_rnn import GatedLinearRNN
from zoo.science.models.gd_ssm import GDSSM
from zoo.science.models.lsa import LinearSelfAttention
from zoo.science.models.stack import SequenceStack
from zoo.science.models.transformer import SoftmaxTransformer


def _discover() -> tuple[Family, ...]:
    """The FAMILY of every module of this package that declares one (block and scan modules do not)."""
    modules = (importlib.import_module(f"{__name__}.{m.name}") for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name))
    return tuple(m.FAMILY for m in modules if isinstance(getattr(m, "FAMILY", None), Family))


FAMILIES: tuple[Family, ...] = _discover()
FAMILY_OF_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.arch_types}  # arch type → its family
CONSTRUCTIONS: dict[str, tuple[Family, ConstructionRule]] = {
    name: (f, rule) for f in FAMILIES for name, rule in f.constructions.items()
}
if len(FAMILY_OF_TYPE) != sum(len(f.arch_types) for f in FAMILIES):
    raise ImportError("two model families claim one arch type")
if len(CONSTRUCTIONS) != sum(len(f.constructions) for f in FAMILIES):
    raise ImportError("two model families claim one construction")


def create_model(arch, task) -> ZooModel:
    """Build the (untrained) model of `arch` (a validated arch config) for `task`."""
    family = FAMILY_OF_TYPE.get(arch.type)
    if family is None:
        raise ValueError(f"unknown architecture type {arch.type!r}")
    return family.build(arch, task)


def length_problem(arch, task_spec) -> str | None:
    """Why the model of `arch` cannot read the prompts of `task_spec`: a position table with fewer rows than its
    tokens (None when it can, or has no table). Checked when an entry, or an entry with overrides, is validated,
    not at its first training step."""
    limit = FAMILY_OF_TYPE[arch.type].token_limit(arch)
    if limit is None:
        return None
    field, rows = limit
    n_tokens = task_spec.build().n_tokens
    if rows < n_tokens:
        return (f"field 'arch.{field}': {rows} positions cannot read this task's {n_tokens}-token prompts "
                f"(needs at least {n_tokens})")
    return None


def construction_problem(arch, task_spec, source) -> str | None:
    """Why `source.construction` cannot set the weights of `arch` on the task `task_spec` (None when it can)."""
    if problem := length_problem(arch, task_spec):
        return problem
    family, rule = CONSTRUCTIONS[source.construction]
    applies_to = rule.arch_types or family.arch_types
    if arch.type not in applies_to:
        types = " or ".join(f"'{t}'" for t in applies_to)
        return f"'{source.construction}' needs arch type {types}"
    return rule.problem(arch, task_spec, source)


def recipe_problem(arch, task_spec, recipe) -> str | None:
    """Why a train recipe asks for what the model of `arch` cannot honour (None when it can): a `recurrent_lr`
    for a model without recurrent parameters (`ZooModel.recurrent_parameter_names`), or `freeze` prefixes that
    name none of its parameters; or a prompt longer than the model's position table (`length_problem`)."""
    if problem := length_problem(arch, task_spec):
        return problem
    if recipe.recurrent_lr is None and not recipe.freeze:
        return None
    with torch.random.fork_rng(devices=[]):  # validating an entry never moves the global generator
        model = create_model(arch, task_spec.build())  # small (the largest entry has 170k parameters)
    if recipe.recurrent_lr is not None and not model.recurrent_parameter_names():
        return (f"field 'source.recurrent_lr': arch type '{arch.type}' has no recurrent parameters for it to apply "
                "to (remove it)")
    names = [name for name, _ in model.named_parameters()]
    unknown = [f for f in recipe.freeze if not any(n == f or n.startswith(f + ".") for n in names)]
    if unknown:
        prefixes = sorted({n.split(".")[0] for n in names})
        return (f"field 'source.freeze': {', '.join(map(repr, unknown))} names no parameter of arch type "
                f"'{arch.type}' (its parameters start with {', '.join(prefixes)})")
    return None


__all__ = [
    "CONSTRUCTIONS", "FAMILIES", "FAMILY_OF_TYPE", "GDSSM", "FastWeightRNN", "GatedLinearRNN", "LinearSelfAttention",
    "NotRecurrentError", "SequenceStack", "SoftmaxTransformer", "ZooModel", "construction_problem", "create_model", "length_problem",
    "recipe_problem",
]
