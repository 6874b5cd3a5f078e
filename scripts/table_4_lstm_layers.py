"""Zucchet et al. Table 4 on the frozen test split: LSTM layers set by the table against the model they stand for,
at several linearisation scales ε, in float64 and float32.

    python scripts/table_4_lstm_layers.py --out reports/zucchet-2023/generated/table-4

Left half: one LSTM layer ≈ the θ_GD linear self-attention layer (`lstm_from_lsa`, against the released
`lsa-gd-zucchet-icl`). Right half: two LSTM layers ≈ a diagonal gated RNN of Eq. 2 (`lstm_from_gated_rnn`),
for two RNNs: the Figure 1 construction of θ_GD (released `gated-rnn-gd-zucchet-icl`: λ ∈ {0, 1}) and the RNN
trained at the paper's recipe (released `gated-rnn-zucchet-icl-b1`: 80 neurons, leaky λ included). Every source
loads from the shipped release (hashes verified). Per row: the relative error of the query read-out,
‖ŷ_LSTM − ŷ‖ / ‖ŷ‖ over the 10,000 test tasks, and both test losses. Writes results.json, table.md and
error-vs-scale.png; prints the table.
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
from zoo.science.models.stack import RecurrentStackArch, lstm2_width, lstm_from_gated_rnn, lstm_from_lsa, lstm_width
from zoo.science.registry import default_registry
from zoo.science.tasks.frozen import load_split

SCALES = (0.1, 0.03, 0.01, 0.003, 0.001)
HALVES = (  # (half, released source entry)
    ("left: 1 LSTM layer ≈ LSA", "lsa-gd-zucchet-icl"),
    ("right: 2 LSTM layers ≈ gated RNN", "gated-rnn-gd-zucchet-icl"),
    ("right: 2 LSTM layers ≈ gated RNN", "gated-rnn-zucchet-icl-b1"),
)


def lstm_for(source, task, eps: float, dtype: torch.dtype):
    """The LSTM stack the table builds from `source` (an LSA or a gated RNN in float64), in `dtype`."""
    if source.__class__.__name__ == "GatedLinearRNN":
        arch = RecurrentStackArch(type="lstm", width=lstm2_width(source.hidden, source.gates), n_layers=2)
        return lstm_from_gated_rnn(create_model(arch, task).to(dtype), source, scale=eps)
    w_v, w_k, w_q = lsa_weights(source)
    arch = RecurrentStackArch(type="lstm", width=lstm_width(w_v.shape[0]))
    return lstm_from_lsa(create_model(arch, task).to(dtype), w_v, w_k, w_q, scale=eps)


@torch.no_grad()
def rows() -> list[dict]:
    out = []
    for half, name in HALVES:
        ckpt = zoo.load(name)
        spec = default_registry().tasks[ckpt.entry.task]
        task = spec.build()
        batch64 = load_split(ckpt.entry.task, "test", spec=spec).batch(task, dtype=torch.float64)
        source = copy.deepcopy(ckpt.model).double().eval()
        reference = source.predict(batch64.tokens)  # (B, d_y)
        source_loss = loss_alone(source, task, batch64)
        for eps in SCALES:
            for dtype in (torch.float64, torch.float32):
                model = lstm_for(source, task, eps, dtype).eval()
                batch = batch64 if dtype == torch.float64 else load_split(ckpt.entry.task, "test", spec=spec).batch(task)
                pred = model.predict(batch.tokens).double()
                out.append({"half": half, "source": name, "source_commit": ckpt.provenance.get("git_commit"),
                            "width": model.blocks[0].width, "layers": len(model.blocks), "scale": eps,
                            "dtype": str(dtype).removeprefix("torch."),
                            "relative_error": float((pred - reference).norm() / reference.norm()),
                            "lstm_test_loss": float(loss_alone(model, task, batch)), "source_test_loss": float(source_loss)})
    return out


def table(results: list[dict]) -> str:
    lines = ["| half | stands for | cells per layer | ε | rel. error float64 | rel. error float32 | LSTM test loss (float32) | "
             "its source's test loss |", "|---|---|---|---|---|---|---|---|"]
    by = {(r["source"], r["scale"], r["dtype"]): r for r in results}
    for half, name in HALVES:
        for eps in SCALES:
            r64, r32 = by[(name, eps, "float64")], by[(name, eps, "float32")]
            lines.append(f"| {half} | `{name}` | {r64['width']} × {r64['layers']} | {eps:g} | {r64['relative_error']:.2e} | "
                         f"{r32['relative_error']:.2e} | {r32['lstm_test_loss']:.6f} | {r64['source_test_loss']:.6f} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for half, name in HALVES:
        for dtype, style in (("float64", "-o"), ("float32", "--x")):
            pts = [(r["scale"], r["relative_error"]) for r in results if r["source"] == name and r["dtype"] == dtype]
            ax.loglog(*zip(*pts), style, label=f"{name} ({dtype})")
    xs = torch.tensor(SCALES)
    ax.loglog(xs, 0.6 * (xs / 0.1) ** 2, ":", color="grey", label="∝ ε²")
    ax.set_xlabel("linearisation scale ε")
    ax.set_ylabel("relative error of the read-out")
    ax.set_title("Zucchet Table 4: LSTM layers vs the model they stand for\n(frozen zucchet-icl test split, 10,000 tasks)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = rows()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.out / "table.md").write_text(text + "\n")
    plot(results, args.out / "error-vs-scale.png")
    print(text)


if __name__ == "__main__":
    main()
