"""Zucchet et al. Figure 2 and Table 1's KV/Q scores: prune a trained student gated RNN, fine-tune it,
and score whether its neurons encode the teacher's key-values and queries.

The paper (section 3.1) prunes only neurons "with input or output weights that are entirely zeros":
"we can remove 86 out of the 100 hidden neurons and 87 out of the 100 pre-readout neurons", with no
threshold stated and no fine-tuning after it (Appendix B.2 fine-tunes only after merging three
output-gating rows into one). Step 1 counts such neurons at several tolerances (the zoo's choice). A
student whose weights did not go to zero keeps every neuron, and its KV and Q scores are then blind:
with (d+1)(d+2)/2 − 1 or more neurons in a group (14 for d = 4) any inputs regress the key-values
perfectly (zoo.science.analysis.rnn.kv_q_scores). So step 2 prunes by function instead, below that blind
spot: it removes, one at a time, the hidden neuron whose silencing raises the loss least (on a fixed
batch of fresh prompts), down to `--hidden` neurons, then the gates the same way down to `--gates`.
Step 3 fine-tunes the pruned network with the zoo's training loop (AdamW, cosine lr, fresh batches)
and scores it on the entry's frozen test split.
Steps 2 and 3 are the zoo's procedure, not the paper's. The defaults keep the sizes of the zoo's
compact construction (d(d+1)/2 memory + d query neurons = 14 for d = 4, the paper's 14 hidden
neurons; d² = 16 gates, where the paper's pruned student keeps 13).

    python scripts/figure_2_prune_finetune.py [ENTRY_OR_FOLDER] --out reports/zucchet-2023/generated/figure-2/<name>
        [--hidden 14 | --by-lambda] [--gates 16] [--steps 20000] [--lr 1e-4] [--prompts 1024] [--compile]

Writes results.json (every stage's metrics and the pruning curve), pruning.png (loss against
neurons kept) and weights.png (the fine-tuned network's matrices, hidden neurons sorted by λ: the
paper's Figure 2.A).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import zoo  # noqa: E402
from zoo.running.train import train  # noqa: E402
from zoo.science.analysis.plots import weight_matrices  # noqa: E402
from zoo.science.analysis.rnn import active_neurons, gated_rnn_matrices, lambda_groups, prune_by_function  # noqa: E402
from zoo.science.evaluation import rescore  # noqa: E402

TOLERANCES = (1e-6, 1e-4, 1e-3, 1e-2, 5e-2)
KEPT = ("test_loss", "polynomial_distance", "kv_score", "q_score", "memory_neurons", "forget_neurons",
        "imperfect_memory_effect")


def batch_loss(task, batch):
    """The loss of an RNN on a fixed batch (prune_by_function calls it without gradients)."""
    return lambda rnn: float(task.loss(rnn.predict(batch.tokens), batch.targets))


def scores(ckpt, model) -> dict:
    scored = copy.copy(ckpt)
    scored.model = model
    metrics = rescore(scored)
    return {k: metrics[k] for k in KEPT if k in metrics} | {
        "hidden": int(model.hidden), "gates": int(model.readout_matrix.shape[1])}


def draw_pruning_curve(result: dict, prompts: int, path: Path) -> None:
    """The loss on the ranking prompts after each greedy cut (results.json's pruning_curve)."""
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    curve = result["pruning_curve"]
    ax.semilogy(range(len(curve)), [r["loss"] for r in curve], ".-", ms=3)
    cut = next((i for i, r in enumerate(curve) if r["hidden"] == result["keep_hidden"]), None)
    if cut is not None:
        ax.axvline(cut, color="grey", lw=0.8, ls=":", label=f"{result['keep_hidden']} hidden left; gates next")
        ax.legend(fontsize=7)
    ax.set_xlabel("units silenced (hidden neurons, then gates; greedy, no fine-tuning)")
    ax.set_ylabel(f"loss on {prompts:,} fresh prompts")
    ax.set_title(f"{result['checkpoint']}: pruning by function", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", default="gated-rnn-student-d4", help="entry name, hub repo or folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, default=None, help="hidden neurons kept (default d(d+1)/2 + d)")
    p.add_argument("--gates", type=int, default=None, help="gates kept (default d²)")
    p.add_argument("--by-lambda", action="store_true",
                   help="prune by λ group instead: keep d(d+1)/2 memory (λ > 0.99) and d forget (λ < 0.01) neurons, "
                        "no leaky one (the paper's pruned student's 10 + 4)")
    p.add_argument("--steps", type=int, default=20000, help="fine-tuning steps")
    p.add_argument("--lr", type=float, default=1e-4, help="fine-tuning peak lr (cosine to the recipe's final lr)")
    p.add_argument("--prompts", type=int, default=1024, help="fresh prompts that rank the units")
    p.add_argument("--compile", action="store_true", help="fine-tune through torch.compile")
    p.add_argument("--replot", action="store_true", help="only redraw pruning.png from OUT/results.json")
    args = p.parse_args()
    if args.replot:
        result = json.loads((args.out / "results.json").read_text())
        draw_pruning_curve(result, result.get("prompts", args.prompts), args.out / "pruning.png")
        return

    ckpt = zoo.load(args.checkpoint)
    model, task, source = ckpt.model.double(), ckpt.task, ckpt.entry.source
    d = task.d
    keep_hidden = args.hidden or d * (d + 1) // 2 + d
    keep_gates = args.gates or d * d
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"checkpoint": args.checkpoint, "commit": ckpt.provenance.get("git_commit"),
                    "trained_steps": ckpt.provenance.get("steps"), "keep_hidden": keep_hidden,
                    "keep_gates": keep_gates, "prompts": args.prompts,
                    "finetune": {"steps": args.steps, "lr": args.lr, "final_lr": source.final_lr,
                                 "weight_decay": source.weight_decay, "batch_size": source.batch_size}}

    # 1. the paper's pruning: neurons whose weights are (numerically) zero
    result["exact_pruning"] = [
        {"tol": tol, "hidden": int(h.sum()), "gates": int(g.sum())}
        for tol in TOLERANCES for h, g in [active_neurons(model, tol)]]
    result["released"] = scores(ckpt, copy.deepcopy(model).float())
    print("released:", result["released"])
    print("kept at tolerance:", result["exact_pruning"])

    # 2. pruning by function, below the KV/Q scores' blind spot
    batch = task.sample(args.prompts, generator=torch.Generator().manual_seed(1234), dtype=torch.float64)
    groups = None
    if args.by_lambda:
        memory, forget, leaky = lambda_groups(model)  # λ > 0.99, λ < 0.01, the rest: the KV / Q scores' groups
        groups = [(memory, d * (d + 1) // 2), (forget, d), (leaky, 0)]
        result["groups"] = {"memory": d * (d + 1) // 2, "forget": d, "leaky": 0}
    small, result["pruning_curve"] = prune_by_function(model, batch_loss(task, batch), hidden=keep_hidden,
                                                       gates=keep_gates, groups=groups)
    small = small.float()
    result["pruned"] = scores(ckpt, small)
    print("pruned:", result["pruned"])

    # 3. fine-tune the pruned network with the entry's recipe at a lower lr
    recipe = source.model_copy(update={"lr": args.lr, "recurrent_lr": None, "steps": args.steps,
                                       "eval_every": max(args.steps // 20, 1), "checkpoint_every": args.steps})
    by = "-lambda" if args.by_lambda else ""
    run_dir = args.out / f".finetune-h{keep_hidden}-g{keep_gates}-{args.steps}-lr{args.lr:g}-p{args.prompts}{by}"  # resumable
    run = train(small, task, recipe, run_dir=run_dir, device="cpu", compiled=args.compile)
    result["finetune"]["history"] = run.history
    result["finetuned"] = scores(ckpt, small)
    print("fine-tuned:", result["finetuned"])
    (args.out / "results.json").write_text(json.dumps(result, indent=1))

    draw_pruning_curve(result, args.prompts, args.out / "pruning.png")
    weight_matrices(gated_rnn_matrices(small), args.out / "weights.png",
                    title=f"{args.checkpoint}, pruned to {keep_hidden} hidden / {keep_gates} gates, fine-tuned {args.steps} steps")


if __name__ == "__main__":
    main()
