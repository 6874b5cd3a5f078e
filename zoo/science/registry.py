"""The declarative zoo: TOML entries under `zoo/science/entries/`, validated with pydantic.

Each file declares `[tasks.<name>]` (a task with its frozen splits) and `[models.<name>]`
(an architecture on a task, trained or constructed, with the paper result it addresses).
Every error names the file, the entry and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import tomllib
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Union, get_args, get_type_hints

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from zoo.science.models import CONSTRUCTIONS, FAMILIES, construction_problem, recipe_problem
from zoo.science.paths import safe_name
from zoo.science.schema import Strict
from zoo.science.tasks import TASK_KINDS

ENTRIES_DIR = Path(__file__).parent / "entries"
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class RegistryError(ValueError):
    """An entry file, entry or field is invalid, or a name is unknown."""


# ---------------------------------------------------------------------------- tasks
class SplitSpec(Strict):
    seed: int  # generator seed of this frozen split
    n: int = Field(10_000, gt=0)  # number of tasks
    w_std: float | None = Field(None, gt=0)  # overrides the task's w_std (Zucchet's shifted validation)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # content hash the split must have


class _TaskEntry(Strict):
    """What a `[tasks.NAME]` adds to its task's own parameters. The parameters (their types, defaults and
    constraints) are declared once, on the task class, and read from it by `task_spec`."""

    description: str = ""
    paper: str = ""  # which paper's setting this is
    splits: dict[Literal["validation", "test"], SplitSpec]
    task_class: ClassVar[type]

    def task_parameters(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self.task_class)}

    def build(self):
        return self.task_class(**self.task_parameters())

    @model_validator(mode="after")
    def _the_task_accepts_it(self):
        self.build()  # the task's own checks (e.g. 'products' needs d_y = 1): a ValueError names them
        return self


def task_spec(task_class: type, kind: str, name: str) -> type[_TaskEntry]:
    """The registry schema of tasks of `kind`: `task_class`'s dataclass fields (type hints with their
    constraints, defaults) as pydantic fields, beside `kind`, description, paper and splits."""
    hints = get_type_hints(task_class, include_extras=True)
    fields = {f.name: (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
              for f in dataclasses.fields(task_class)}
    spec = create_model(name, __base__=_TaskEntry, __module__=__name__, kind=(Literal[kind], ...), **fields)
    spec.task_class = task_class
    return spec


# One schema per task kind found in zoo/science/tasks/ (a new kind is its own file there).
TASK_SPECS: dict[str, type[_TaskEntry]] = {
    kind: task_spec(cls, kind, f"{cls.__name__}Spec") for kind, cls in TASK_KINDS.items()
}

TaskSpec = Annotated[Union[tuple(TASK_SPECS.values())], Field(discriminator="kind")]


# ---------------------------------------------------------------------------- architectures
# Each family declares its arch schema beside its model (zoo/science/models/<family>.py); an entry's
# `arch` is the union of them, told apart by `type`.
Arch = Annotated[Union[tuple(f.arch for f in FAMILIES)], Field(discriminator="type")]
ConstructionName = Literal[tuple(CONSTRUCTIONS)]  # every construction some family supports


# ---------------------------------------------------------------------------- sources
class TrainRecipe(Strict):
    kind: Literal["trained"]
    optimizer: Literal["adamw", "adam_l2"] = "adamw"  # decoupled decay, or Adam with weight_decay as an L2 term in the gradient
    lr: float = Field(1e-3, gt=0)  # peak learning rate
    final_lr: float = Field(0.0, ge=0)  # end of the cosine decay
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    grad_clip: float | None = Field(None, gt=0)  # global-norm clip
    # Steps whose loss or gradient overflows to inf/NaN that are skipped (no update; the lr schedule
    # moves on), as AMP's GradScaler skips an overflowing step; one more stops training. 0: stop on the
    # first non-finite loss (one model at a time: an ensemble refuses a recipe that skips).
    max_skipped_steps: int = Field(0, ge=0)
    recurrent_lr: float | None = Field(None, gt=0)  # peak lr of the recurrent ν's (GD-SSM: 1e-4 vs 2e-4)
    seed: int = 0
    eval_every: int = Field(500, gt=0)  # validation on the frozen split every N steps
    checkpoint_every: int = Field(1000, gt=0)  # resumable training state every N steps
    init: ConstructionName | None = None  # start from this construction instead of random weights
    init_eta: float | Literal["analytic", "line_search"] = "analytic"  # the GD rate of that construction (as its `eta`)
    freeze: list[str] = []  # parameter-name prefixes left as initialised (e.g. the constructed layers)

    @model_validator(mode="after")
    def _sane_schedule(self):
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {tuple(self.betas)} must each lie in [0, 1)")
        if self.final_lr > self.lr:
            raise ValueError(f"final_lr {self.final_lr:g} exceeds the peak lr {self.lr:g}")
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} exceeds steps {self.steps}")
        return self

    def frozen(self, name: str) -> bool:
        """Is parameter `name` frozen? (Ensembles escape dots as '__'.)"""
        return any(name == f or name.startswith((f + ".", f + "__")) for f in self.freeze)


class Construction(Strict):
    """A constructed source: `construction` names an analytic construction of a family; the other
    fields are that construction's knobs, declared beside it (`ConstructionRule.knobs` in
    zoo/science/models/<family>.py: e.g. `eta`, `lsa`, `compact`, `scale`). Each construction validates as
    its own subclass (`CONSTRUCTION_SOURCES`), so a knob another construction takes is an error here."""

    kind: Literal["constructed"]
    construction: ConstructionName

    @model_validator(mode="before")
    @classmethod
    def _legacy_knobs(cls, data, info: ValidationInfo):
        """A config.json written before each construction declared its knobs holds all four of the old
        schema's, at their defaults where the construction did not read them: those are dropped (outside
        the registry), as they never reached the weights. Anything else undeclared stays, and is an error."""
        if isinstance(data, dict) and not _in_registry(info):
            data = {k: v for k, v in data.items()
                    if k in cls.model_fields or k not in LEGACY_KNOBS or v != LEGACY_KNOBS[k]}
        return data

    @classmethod
    def of(cls, construction: str, **knobs) -> Construction:
        """The validated source `{kind = "constructed", construction = …, **knobs}`."""
        return SOURCE_ADAPTER.validate_python({"kind": "constructed", "construction": construction, **knobs})


# Every field the one `Construction` schema had before the families declared their knobs, with its default.
LEGACY_KNOBS = {"lsa": "gd", "scale": 0.01, "compact": False, "eta": "analytic"}


def _construction_source(name: str, knobs: type[Strict]) -> type[Construction]:
    model = create_model(f"Construction[{name}]", __base__=(knobs, Construction),  # fields: kind, construction, knobs
                         construction=(Literal[name], Field(description="the family's construction")))
    model.__doc__ = f"source.kind = 'constructed' with construction = {name!r} and its knobs ({knobs.__name__})."
    return model


# construction name → its source schema: `Construction` with the knobs its family declares
CONSTRUCTION_SOURCES: dict[str, type[Construction]] = {
    name: _construction_source(name, rule.knobs) for name, (_, rule) in CONSTRUCTIONS.items()
}


def _construction_tag(data) -> str | None:
    return data.get("construction") if isinstance(data, dict) else getattr(data, "construction", None)


Constructed = Annotated[
    Union[tuple(Annotated[model, Tag(name)] for name, model in CONSTRUCTION_SOURCES.items())],
    Discriminator(_construction_tag, custom_error_type="unknown_construction",
                  custom_error_message="'construction' must be one of "
                                       + ", ".join(map(repr, CONSTRUCTION_SOURCES)))]


Source = Annotated[Union[TrainRecipe, Constructed], Field(discriminator="kind")]


def _in_registry(info: ValidationInfo) -> bool:
    """Is this a registry entry being loaded (zoo/science/entries/*.toml)? The registry's rules are stricter
    than a checkpoint's: a config.json written by an older zoo must still load."""
    return bool(info.context and info.context.get("registry"))


class Expected(Strict):
    """A number an entry is checked against (zoo/science/expected.py), and where the number comes from.

    `source = "paper"`: a number the paper prints, with its words (`quote`) and where (`section`);
    only these are graded "meets" / "falls short". `source = "reference"`: a closed form or a
    construction the zoo computes (`note` says which); shown as "matches the reference" /
    "differs from the reference", never as a paper verdict.

    `kind` says what the claim is: `within` (the value, to a tolerance), `at_most` / `at_least`
    (a bound, with an optional margin), or `paired_gd` (the model's loss equals one GD step's:
    `value` is the paper's model loss and `gd_value` its GD loss; the zoo's paired difference
    against GD on the same test tasks, with its standard error, must be no larger than the
    paper's gap plus two standard errors; a reference claim gives the closed form as both, and its margin, if
    any, as `rel_tol`)."""

    value: float = Field(allow_inf_nan=False)  # the number (the paper's, or the reference's)
    source: Literal["paper", "reference"] | None = None  # required in the registry; None: a checkpoint of an older zoo
    quote: str = ""  # source = "paper": the paper's words that print the number
    section: str = ""  # source = "paper": where they are (paper, section / table / figure)
    claim: str = ""  # the paper's sentence that says what the number shows, when `quote` (a table cell) does not
    kind: Literal["within", "at_most", "at_least", "paired_gd"] = "within"
    rel_tol: float | None = Field(None, ge=0, allow_inf_nan=False)  # relative: |m − v| ≤ rel_tol·|v| (a bound: its margin)
    # An order-of-magnitude claim is checked on a log scale instead: |log10(m / v)| ≤ log10_tol.
    log10_tol: float | None = Field(None, gt=0, allow_inf_nan=False)
    gd_value: float | None = Field(None, gt=0, allow_inf_nan=False)  # kind = "paired_gd": the paper's GD loss (a reference: = value)
    note: str = ""

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo):
        if self.log10_tol is not None and self.value <= 0:
            raise ValueError("log10_tol needs a positive value")
        if (self.kind == "paired_gd") != (self.gd_value is not None):
            raise ValueError("gd_value (the paper's GD loss) goes with kind = 'paired_gd', and only with it")
        if not _in_registry(info):
            return self
        if self.source is None:
            raise ValueError("field 'source' is required: \"paper\" (a number the paper prints, with its quote "
                             "and section) or \"reference\" (a closed form or construction the zoo computes)")
        if self.source == "paper" and not (self.quote.strip() and self.section.strip()):
            raise ValueError("a paper value needs the paper's words (quote) and where they are (section)")
        if self.source == "reference" and not self.note.strip():
            raise ValueError("a reference value needs a note saying what computes it")
        if self.kind == "within" and (self.rel_tol is None) == (self.log10_tol is None):
            raise ValueError("kind 'within' needs one tolerance: rel_tol or log10_tol")
        if self.kind != "within" and self.rel_tol is not None and self.log10_tol is not None:
            raise ValueError("a bound takes at most one margin: rel_tol or log10_tol")
        if self.kind == "paired_gd" and self.log10_tol is not None:
            raise ValueError("kind 'paired_gd' is checked on the paired gap, not on a log scale: no log10_tol")
        if self.kind == "paired_gd" and self.source == "paper" and self.rel_tol is not None:
            raise ValueError("a paper's 'paired_gd' is checked against the paper's gap and the paired standard error: "
                             "no rel_tol")
        if self.kind == "paired_gd" and self.source == "reference" and self.gd_value != self.value:
            raise ValueError("a reference 'paired_gd' claims the model's loss is one GD step's: gd_value must equal value "
                             "(the closed form); a margin is rel_tol")
        return self


class Deviation(Strict):
    """A declared departure from the paper (or a choice where the paper states nothing): what the
    paper says, what the zoo does, and why. Shown on the entry's card and in the release index."""

    id: str = ""  # the [deviations.<id>] table it was declared in (one declaration, many entries)
    what: str  # in a few words: "optimiser", "teacher and input distributions"
    paper: str  # what the paper says, quoted with its section, or what it leaves unstated
    zoo: str  # what the zoo does instead
    why: str = ""  # why (measured where it matters); required in the registry
    # dotted entry fields whose override ends this departure (e.g. "arch.positions"): `with_overrides` drops it from
    # such a run's entry, so the run's card does not declare what it no longer does. Registry-only (not in configs).
    lifted_by: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo):
        if _in_registry(info) and not all(x.strip() for x in (self.what, self.paper, self.zoo, self.why)):
            raise ValueError("a deviation needs 'what', 'paper' (what the paper says), 'zoo' (what the zoo does) and 'why'")
        return self


class Entry(Strict):
    name: str
    file: str
    description: str = ""
    paper: str  # seed paper and the table/figure it addresses
    task: str  # name of a [tasks.*] entry
    arch: Arch
    source: Source
    expected: dict[str, Expected] = {}  # metric name → paper or reference value; shown on the model card
    # How this entry departs from the paper's setting or recipe, each item declared once in its file's
    # [deviations.<id>] and named here; shown on the card and in the release index.
    deviation: list[Deviation] = []
    paper_recipe: str | None = None  # with a deviation: the entry that trains the paper's own recipe, shown beside it

    @field_validator("deviation", mode="before")
    @classmethod
    def _legacy_deviation(cls, v):
        """A config.json of an older zoo has one sentence (or "") here."""
        if isinstance(v, str):
            return [{"what": "recipe", "paper": "", "zoo": v}] if v.strip() else []
        return v

    @field_validator("name")
    @classmethod
    def _kebab(cls, v: str) -> str:
        if not KEBAB.match(v):
            raise ValueError(f"name {v!r} must be kebab-case (lowercase letters, digits, '-')")
        return v

    @field_validator("task")
    @classmethod
    def _task_is_a_safe_name(cls, v: str) -> str:
        return safe_name(v)  # it names a cache folder: a config.json from a Hub must not escape it


TASK_ADAPTER = TypeAdapter(TaskSpec)
ARCH_TAGS = {tag for model in get_args(get_args(Arch)[0]) for tag in get_args(model.model_fields["type"].annotation)}
SOURCE_TAGS = {"trained", "constructed"}  # `kind`; a constructed source's second tag is its construction's name


class PaperLink(Strict):
    """Where a paper lives: an arXiv id (a Hub `arxiv:` tag and a link) or a URL."""

    title: str
    arxiv: str | None = Field(None, pattern=r"^\d{4}\.\d{4,5}$")
    url: str | None = Field(None, pattern=r"^https://")

    @model_validator(mode="after")
    def _somewhere(self):
        if self.arxiv is None and self.url is None:
            raise ValueError("a paper link needs 'arxiv' or 'url'")
        return self


class PaperInfo(Strict):
    """An entry file's `[paper]` table: what the model cards of its entries cite. (Files without one
    take theirs from model_cards/papers.toml, keyed by the file's stem.)"""

    citation: str = ""  # BibTeX, shown on every card of the file's entries
    prose: str = ""  # the paper's setting, shown after the family's card prose
    links: dict[str, PaperLink] = {}  # a word of an entry's `paper` field → the paper it names (with papers.toml's)


class Registry:
    def __init__(self, tasks: dict[str, TaskSpec], entries: dict[str, Entry], papers: dict[str, PaperInfo] | None = None):
        self.tasks = tasks
        self.entries = entries
        self.papers = papers or {}  # entry file name (e.g. "zucchet.toml") → its [paper] table

    def entry(self, name: str) -> Entry:
        if name not in self.entries:
            near = [n for n in self.entries if name.split("-")[0] in n][:5]
            hint = f"; similar: {', '.join(near)}" if near else ""
            raise RegistryError(f"unknown entry {name!r} (see `zoo list`){hint}")
        return self.entries[name]

    def task(self, name: str) -> TaskSpec:
        if name not in self.tasks:
            raise RegistryError(f"unknown task {name!r}; known: {', '.join(sorted(self.tasks))}")
        return self.tasks[name]


# Bump when an existing field's default changes: every definition that relied on the old default
# then hashes differently, and the release rebuilds what was built under it.
DEFAULTS_VERSION = 1
ARCH_ADAPTER = TypeAdapter(Arch)
SOURCE_ADAPTER = TypeAdapter(Source)


def _explicit(adapter: TypeAdapter, data: dict) -> dict:
    """`data` validated, then dumped without the fields left at their defaults."""
    return adapter.dump_python(adapter.validate_python(data), mode="json", exclude_defaults=True)


# Task fields that document a task and do not change its data: left out of `definition_sha256`.
TASK_NOTES = ("description", "paper")


def definition_sha256(entry: dict, task: dict) -> str:
    """SHA-256 of what determines an entry's weights and its measured numbers: its arch, its source
    (recipe or construction) and its task's data (as in a checkpoint's config.json). Nothing else of
    the entry enters (its `expected` values and tolerances, notes, `deviation`, description, paper),
    nor the task's description and paper: changing those re-renders cards and the index (`zoo release
    refresh`) and never makes a released entry stale. Fields at their defaults are left out, so a
    field added later with a default that keeps the old behaviour leaves every existing definition,
    and every checkpoint built from one, current."""
    import hashlib
    import json

    data = {k: v for k, v in _explicit(TASK_ADAPTER, task).items() if k not in TASK_NOTES}
    doc = {"arch": _explicit(ARCH_ADAPTER, entry["arch"]), "source": _explicit(SOURCE_ADAPTER, entry["source"]),
           "task": data, "defaults": DEFAULTS_VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def initial_construction(entry: Entry) -> Entry:
    """A trained entry with `source.init` as the constructed entry its training starts from."""
    source = CONSTRUCTION_SOURCES[entry.source.init]
    knobs = {"eta": entry.source.init_eta} if "eta" in source.model_fields else {}
    return entry.model_copy(update={"source": source(kind="constructed", construction=entry.source.init, **knobs)})


def _format_errors(file: Path, kind: str, name: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        # a discriminated union puts the tag in the path (arch.gated_rnn.hidden, and a constructed source's
        # two: source.constructed.gd.eta): drop them
        if kind == "task" and loc and loc[0] in TASK_KINDS:
            loc = loc[1:]
        elif len(loc) > 1 and loc[0] == "arch" and loc[1] in ARCH_TAGS:
            loc = loc[:1] + loc[2:]
        elif len(loc) > 1 and loc[0] == "source" and loc[1] in SOURCE_TAGS:
            tagged = loc[1] == "constructed" and len(loc) > 2 and loc[2] in CONSTRUCTION_SOURCES
            if tagged and e["type"] == "extra_forbidden":  # a knob of another construction: say which this one takes
                knobs = [k for k in CONSTRUCTION_SOURCES[loc[2]].model_fields if k not in Construction.model_fields]
                e = {**e, "msg": f"'{loc[2]}' takes no such knob (its knobs: {', '.join(knobs) or 'none'})"}
            loc = loc[:1] + loc[3 if tagged else 2:]
        field = ".".join(str(p) for p in loc) or "(entry)"
        lines.append(f"{file.name}: {kind} '{name}': field '{field}': {e['msg']}")
    return "\n".join(lines)


def load_registry(directory: Path = ENTRIES_DIR) -> Registry:
    """Every entry file of `directory`. Declared departures (`[deviations.<id>]`, in any file) are
    one namespace: an entry names the ones that apply to it (`deviation = ["<id>", ...]`). A file's
    `[paper]` table (citation, prose, links) is what its entries' cards cite. Every problem of every file is
    collected, then raised as one RegistryError naming file, entry and field."""
    errors: list[str] = []
    docs, papers, deviations = _read_files(Path(directory), errors)
    tasks = _read_tasks(docs, errors)
    entries, used = _read_entries(docs, deviations, errors)
    for unused in sorted(set(deviations) - used):
        errors.append(f"{deviations[unused][0].name}: [deviations.{unused}] is declared but no entry names it")
    for entry in entries.values():
        errors += _entry_problems(entry, entries, tasks)
    if errors:
        raise RegistryError("invalid zoo registry:\n" + "\n".join(errors))
    return Registry(tasks, entries, papers)


def _read_files(directory: Path, errors: list[str]):
    """Each entry file parsed: (file, document) pairs, the `[paper]` tables by file name, and the declared
    departures by id (with the file declaring each)."""
    docs: list[tuple[Path, dict]] = []
    papers: dict[str, PaperInfo] = {}
    deviations: dict[str, tuple[Path, dict]] = {}
    for file in sorted(directory.glob("*.toml")):
        try:
            doc = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as e:
            errors.append(f"{file.name}: not valid TOML: {e}")
            continue
        unknown = set(doc) - {"tasks", "models", "deviations", "paper"}
        if unknown:
            errors.append(f"{file.name}: unknown top-level table(s) {sorted(unknown)}; "
                          "expected [tasks.*], [models.*], [deviations.*] and [paper]")
        if "paper" in doc:
            try:
                papers[file.name] = PaperInfo.model_validate(doc["paper"])
            except ValidationError as e:
                errors.append(_format_errors(file, "table", "paper", e))
        for name, raw in doc.get("deviations", {}).items():
            if name in deviations:
                errors.append(f"{file.name}: [deviations.{name}]: duplicate name (also in {deviations[name][0].name})")
            elif not KEBAB.match(name) or not isinstance(raw, dict):
                errors.append(f"{file.name}: [deviations.{name}]: a kebab-case name and a table (what, paper, zoo, why)")
            else:
                deviations[name] = (file, raw)
        docs.append((file, doc))
    return docs, papers, deviations


def _read_tasks(docs, errors: list[str]) -> dict[str, TaskSpec]:
    tasks: dict[str, TaskSpec] = {}
    for file, doc in docs:
        for name, raw in doc.get("tasks", {}).items():
            if not KEBAB.match(name):
                errors.append(f"{file.name}: task '{name}': the name must be kebab-case (lowercase letters, digits, '-')")
            elif name in tasks:
                errors.append(f"{file.name}: task '{name}': duplicate name")
            else:
                try:
                    tasks[name] = TASK_ADAPTER.validate_python(raw)
                except ValidationError as e:
                    errors.append(_format_errors(file, "task", name, e))
    return tasks


def _read_entries(docs, deviations: dict, errors: list[str]) -> tuple[dict[str, Entry], set[str]]:
    """The `[models.*]` of every file validated, their `deviation` ids resolved to the declared tables; also
    the ids some entry names."""
    entries: dict[str, Entry] = {}
    used: set[str] = set()
    for file, doc in docs:
        for name, raw in doc.get("models", {}).items():
            if name in entries:
                errors.append(f"{file.name}: entry '{name}': duplicate name (also in {entries[name].file})")
                continue
            raw = dict(raw)
            if "deviation" in raw:
                ids = raw["deviation"]
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                    errors.append(f"{file.name}: entry '{name}': field 'deviation': a list of names of "
                                  "[deviations.<id>] tables")
                    continue
                missing = [i for i in ids if i not in deviations]
                if missing:
                    errors.append(f"{file.name}: entry '{name}': field 'deviation': no [deviations.{missing[0]}] "
                                  "in the entry files")
                    continue
                used.update(ids)
                raw["deviation"] = [{**deviations[i][1], "id": i} for i in ids]
            try:
                entries[name] = Entry.model_validate({**raw, "name": name, "file": file.name},
                                                     context={"registry": True})
            except ValidationError as e:
                errors.append(_format_errors(file, "entry", name, e))
    return entries, used


def _entry_problems(entry: Entry, entries: dict[str, Entry], tasks: dict[str, TaskSpec]) -> list[str]:
    """What an entry asks that the rest of the registry or its family cannot give: an unknown task or paper
    recipe, a construction that does not apply, training settings the family cannot honour."""
    where = f"{entry.file}: entry '{entry.name}'"
    problems = []
    if entry.paper_recipe is not None and (entry.paper_recipe not in entries or not entry.deviation):
        problems.append(f"{where}: field 'paper_recipe': needs a 'deviation' and an existing entry, "
                        f"got {entry.paper_recipe!r}")
    if entry.task not in tasks:
        return problems + [f"{where}: field 'task': unknown task {entry.task!r}"]
    task = tasks[entry.task]
    if entry.source.kind == "constructed":
        problem = construction_problem(entry.arch, task, entry.source)
        return problems + ([f"{where}: field 'source.construction': {problem}"] if problem else [])
    if entry.source.init:
        if "init_eta" in entry.source.model_fields_set and "eta" not in CONSTRUCTION_SOURCES[entry.source.init].model_fields:
            return problems + [f"{where}: field 'source.init_eta': '{entry.source.init}' takes no eta"]
        problem = construction_problem(entry.arch, task, initial_construction(entry).source)
        if problem:
            problems.append(f"{where}: field 'source.init': {problem}")
    problem = recipe_problem(entry.arch, task, entry.source)
    return problems + ([f"{where}: {problem}"] if problem else [])


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    return load_registry()


def list_entries(filter: str | None = None, **fields) -> list[Entry]:
    """Entries whose name contains `filter` and whose fields match, e.g. arch_type="lsa", source="trained"."""
    out = []
    for e in default_registry().entries.values():
        if filter and filter not in e.name:
            continue
        if "arch_type" in fields and e.arch.type != fields["arch_type"]:
            continue
        if "source" in fields and e.source.kind != fields["source"]:
            continue
        if "task" in fields and e.task != fields["task"]:
            continue
        out.append(e)
    return sorted(out, key=lambda e: e.name)


def get_entry(name: str) -> Entry:
    return default_registry().entry(name)


def unknown_entry_error(name: str) -> RegistryError:
    """The error for a bare name that is not a registry entry, with the nearest names."""
    near = difflib.get_close_matches(name, list(default_registry().entries), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else " (see `zoo list`)"
    return RegistryError(f"{name!r} is not a registry entry{hint}")


def task_variant(base: str, overrides: dict[str, object]) -> str:
    """Register (for this process) the task `base` with fields replaced, e.g. {"n_context": 20},
    and return its name, `<base>--n_context=20`. Its frozen splits use the base's seeds; their
    hashes are not pinned (the registry records none for variants) but are checked on reload
    from the cache and recorded in every checkpoint's provenance."""
    if not overrides:
        return base
    registry = default_registry()
    name = base + "".join(f"--{k}={v}" for k, v in overrides.items())

    try:
        safe_name(name, "task variant")
    except ValueError as e:
        raise RegistryError(f"task '{base}': overrides {overrides}: {e}") from None
    data = registry.task(base).model_dump(mode="json")
    for key, value in overrides.items():
        if key == "splits" or key not in data:
            raise RegistryError(f"task '{base}': override 'task.{key}': no such task field")
        data[key] = value
    for split in data["splits"].values():
        split["sha256"] = None
    try:
        registry.tasks[name] = TASK_ADAPTER.validate_python(data)
    except ValidationError as e:
        raise RegistryError(_format_errors(Path("(override)"), "task", name, e)) from None
    return name


def with_overrides(entry: Entry, overrides: dict[str, object]) -> Entry:
    """`entry` with dotted fields replaced, e.g. {"arch.hidden": 16, "source.lr": 3e-4},
    validated like a registry entry (a bad field or value names the field). `task.<field>`
    keys switch the entry to a task variant (`task_variant`)."""
    task_fields = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("task.")}
    overrides = {k: v for k, v in overrides.items() if not k.startswith("task.")}
    if task_fields:
        overrides["task"] = task_variant(entry.task, task_fields)
    data = entry.model_dump(mode="json")
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise RegistryError(f"entry '{entry.name}': override '{dotted}': no field '{key}'")
            node = node[key]
        node[leaf] = value  # an unknown leaf is caught below (extra fields are forbidden)
    try:
        new = Entry.model_validate(data)
    except ValidationError as e:
        raise RegistryError(_format_errors(Path(entry.file), "entry", entry.name, e)) from None
    kept = [d for d in entry.deviation if not set(d.lifted_by) & set(overrides)]  # model_dump left out lifted_by
    # The registered description may state what the overrides change (a width, a parameter count): say so on the
    # run's config and card rather than let it describe another model.
    changed = ", ".join(f"{k} = {v}" for k, v in overrides.items())
    description = f"{entry.description} (As registered; this run overrides {changed}.)".lstrip()
    new = new.model_copy(update={"deviation": kept, "description": description})
    check = construction_problem if new.source.kind == "constructed" else recipe_problem
    problem = check(new.arch, default_registry().task(new.task), new.source)
    if problem:
        raise RegistryError(f"{entry.file}: entry '{entry.name}' with {overrides}: {problem}")
    return new


def get_task_spec(name: str) -> TaskSpec:
    return default_registry().task(name)
