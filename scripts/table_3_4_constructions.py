"""Zucchet et al. Tables 3–4 on the frozen test split: LSTM and LRU layers set to stand for a linear
self-attention layer or a diagonal gated RNN, against the model they stand for, at several linearisation
scales ε in float64 and float32, and over longer streams at the registry's ε.

    python scripts/table_3_4_constructions.py --out reports/zucchet-2023/generated/table-4

Constructions (zoo/science/models/stack_constructions.py), each against its source loaded from the shipped
release (hashes verified): one LSTM layer ⇐ `lsa-gd-zucchet-icl` (Table 4, left); two LSTM layers, one LRU
In+Out layer, two LRU Out layers and two LRU In+Skip layers ⇐ a diagonal gated RNN (Table 4, right; Table 3),
for two RNNs: Figure 1's construction of θ_GD (`gated-rnn-gd-zucchet-icl`, λ ∈ {0, 1}) and the RNN trained at
the paper's recipe (`gated-rnn-zucchet-icl-b1`, 80 neurons, leaky λ included); one LRU In+Skip layer ⇐
`lsa-gd-zucchet-icl` (Table 3). Per row: the relative error of the query read-out, ‖ŷ − ŷ_source‖ / ‖ŷ_source‖
over the 10,000 test tasks, and both test losses. The length sweep samples
the same task distribution's prompts with more examples in context (one task each; float64) and compares
the query's prediction. Writes results.json, lengths.json,
table.md and error-vs-scale.png; prints the tables.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

import zoo
from zoo.science.evaluation import loss_alone
from zoo.science.models import create_model
from zoo.science.models.lsa import lsa_weights
from zoo.science.models.stack import RecurrentStackArch
from zoo.science.models.stack_constructions import (
    LRU_LAYERS,
    lru_from_gated_rnn,
    lru_in_skip_from_lsa,
    lru_in_skip_lsa_size,
    lru_size,
    lstm2_width,
    lstm_from_gated_rnn,
    lstm_from_lsa,
    lstm_width,
)
from zoo.science.registry import default_registry
from zoo.science.tasks.frozen import load_split

SCALES = (0.1, 0.03, 0.01, 0.003, 0.001)
REGISTRY_SCALE = 0.01  # every constructed entry's ε (zoo/science/entries/comparisons.toml)
LENGTHS = (12, 48, 100, 400)  # examples in context: the task's 12, then longer prompts of the same task distribution
PROMPTS = 2000


def _lstm_lsa(lsa, task, eps, dtype):
    w_v, w_k, w_q = lsa_weights(lsa)
    model = create_model(RecurrentStackArch(type="lstm", width=lstm_width(w_v.shape[0])), task).to(dtype)
    return lstm_from_lsa(model, w_v, w_k, w_q, scale=eps)


def _lstm_rnn(rnn, task, eps, dtype):
    arch = RecurrentStackArch(type="lstm", width=lstm2_width(rnn.hidden, rnn.gates), n_layers=2)
    return lstm_from_gated_rnn(create_model(arch, task).to(dtype), rnn, scale=eps)


def _lru_rnn(variant):
    def build(rnn, task, eps, dtype):
        arch = RecurrentStackArch(type="lru", variant=variant, n_layers=LRU_LAYERS[variant], residual=False,
                                  **lru_size(rnn.hidden, rnn.gates, rnn.d_in, variant))
        return lru_from_gated_rnn(create_model(arch, task).to(dtype), rnn, scale=eps)
    return build


def _lru_in_skip_lsa(lsa, task, eps, dtype):
    w_v, w_k, w_q = lsa_weights(lsa)
    arch = RecurrentStackArch(type="lru", variant="in_skip", residual=False, **lru_in_skip_lsa_size(w_v.shape[0]))
    return lru_in_skip_from_lsa(create_model(arch, task).to(dtype), w_v, w_k, w_q, scale=eps)


CONSTRUCTIONS = (  # (what, the table's cell, build(source, task, ε, dtype), released sources)
    ("1 LSTM layer ≈ LSA", "Table 4 left", _lstm_lsa, ("lsa-gd-zucchet-icl",)),
    ("2 LSTM layers ≈ gated RNN", "Table 4 right", _lstm_rnn, ("gated-rnn-gd-zucchet-icl", "gated-rnn-zucchet-icl-b1")),
    ("1 LRU In+Out layer ≈ gated RNN", "Table 3", _lru_rnn("in_out"), ("gated-rnn-gd-zucchet-icl", "gated-rnn-zucchet-icl-b1")),
    ("2 LRU Out layers ≈ gated RNN", "Table 3", _lru_rnn("out"), ("gated-rnn-gd-zucchet-icl", "gated-rnn-zucchet-icl-b1")),
    ("2 LRU In+Skip layers ≈ gated RNN", "Table 3", _lru_rnn("in_skip"), ("gated-rnn-gd-zucchet-icl", "gated-rnn-zucchet-icl-b1")),
    ("1 LRU In+Skip layer ≈ LSA", "Table 3", _lru_in_skip_lsa, ("lsa-gd-zucchet-icl",)),
)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@torch.no_grad()
def run() -> tuple[list[dict], list[dict]]:
    scales, lengths = [], []
    sources = {}
    for what, cell, build, names in CONSTRUCTIONS:
        for name in names:
            if name not in sources:
                ckpt = zoo.load(name)
                spec = default_registry().tasks[ckpt.entry.task]
                split = load_split(ckpt.entry.task, "test", spec=spec)
                sources[name] = (ckpt, spec.build(), split)
            ckpt, task, split = sources[name]
            source = copy.deepcopy(ckpt.model).double().eval()
            batch64 = split.batch(task, dtype=torch.float64)
            reference = source.predict(batch64.tokens)  # (B, d_y)
            source_loss = float(loss_alone(source, task, batch64))
            for eps in SCALES:
                for dtype in (torch.float64, torch.float32):
                    model = build(source, task, eps, dtype).eval()
                    batch = batch64 if dtype == torch.float64 else split.batch(task)
                    scales.append({"construction": what, "cell": cell, "source": name, "source_commit": ckpt.provenance.get("git_commit"),
                                   "width": model.blocks[0].lstm.hidden_size if hasattr(model.blocks[0], "lstm") else model.blocks[0].w_m.shape[0],
                                   "layers": len(model.blocks), "scale": eps, "dtype": str(dtype).removeprefix("torch."),
                                   "relative_error": relative(model.predict(batch.tokens), reference),
                                   "test_loss": float(loss_alone(model, task, batch)), "source_test_loss": source_loss})
            model = build(source, task, REGISTRY_SCALE, torch.float64).eval()
            spec = default_registry().tasks[ckpt.entry.task]
            for length in LENGTHS:  # one task per prompt, with `length` examples in context: the query's prediction
                tokens = spec.model_copy(update={"n_context": length}).build().sample(PROMPTS, seed=7, dtype=torch.float64).tokens
                lengths.append({"construction": what, "source": name, "scale": REGISTRY_SCALE, "dtype": "float64",
                                "n_context": length, "prompts": PROMPTS,
                                "relative_error_query": relative(model(tokens)[:, -1], source(tokens)[:, -1])})
    return scales, lengths


def tables(scales: list[dict], lengths: list[dict]) -> str:
    lines = ["| construction | stands for | ε | rel. error float64 | rel. error float32 | test loss (float32) | its source's |",
             "|---|---|---|---|---|---|---|"]
    by = {(r["construction"], r["source"], r["scale"], r["dtype"]): r for r in scales}
    for what, _, _, names in CONSTRUCTIONS:
        for name in names:
            for eps in SCALES:
                r64, r32 = by[(what, name, eps, "float64")], by[(what, name, eps, "float32")]
                lines.append(f"| {what} | `{name}` | {eps:g} | {r64['relative_error']:.2e} | {r32['relative_error']:.2e} | "
                             f"{r32['test_loss']:.6f} | {r64['source_test_loss']:.6f} |")
    lines += ["", f"Longer prompts at ε = {REGISTRY_SCALE} (float64, {PROMPTS:,} fresh prompts of one task each), relative error "
              "of the query's prediction by examples in context:", "",
              "| construction | stands for | " + " | ".join(f"N = {t}" for t in LENGTHS) + " |",
              "|---|---|" + "---|" * len(LENGTHS)]
    by_len = {(r["construction"], r["source"], r["n_context"]): r["relative_error_query"] for r in lengths}
    for what, _, _, names in CONSTRUCTIONS:
        for name in names:
            lines.append(f"| {what} | `{name}` | " + " | ".join(f"{by_len[(what, name, t)]:.2e}" for t in LENGTHS) + " |")
    return "\n".join(lines)


def plot(scales: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, dtype in zip(axes, ("float64", "float32")):
        for what, _, _, names in CONSTRUCTIONS:
            for name in names:
                pts = [(r["scale"], r["relative_error"]) for r in scales
                       if r["construction"] == what and r["source"] == name and r["dtype"] == dtype]
                ax.loglog(*zip(*pts), "-o" if "LSTM" in what else "--x", ms=4, label=f"{what} ({name})")
        xs = torch.tensor(SCALES)
        ax.loglog(xs, 0.6 * (xs / 0.1) ** 2, ":", color="grey", label="∝ ε²")
        ax.set_xlabel("linearisation scale ε")
        ax.set_title(dtype)
    axes[0].set_ylabel("relative error of the query read-out")
    axes[1].legend(fontsize=6)
    fig.suptitle("Zucchet Tables 3–4: LSTM / LRU layers vs the model they stand for (zucchet-icl test split, 10,000 tasks)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scales, lengths = run()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(scales, indent=1) + "\n")
    (args.out / "lengths.json").write_text(json.dumps(lengths, indent=1) + "\n")
    text = tables(scales, lengths)
    (args.out / "table.md").write_text(text + "\n")
    plot(scales, args.out / "error-vs-scale.png")
    print(text)


if __name__ == "__main__":
    main()
