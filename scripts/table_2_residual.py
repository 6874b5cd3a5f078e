"""Zucchet et al. Table 2: where the trained gated RNN's residual (every instantaneous-polynomial term
other than x_i² y_1) lives, and why AdamW keeps it.

At the query token y = 0, so a neuron that forgets (λ ≈ 0, read only at its own token) never sees
its y-inputs multiplied by anything non-zero at the query: the loss has no gradient for them, yet
they contribute y-carrying terms to the instantaneous polynomial. Zeroing them must leave the test
loss where it is; whatever residual disappears with them was never constrained by training.
Decoupled weight decay shrinks such a weight by exp(−wd·Σ_t lr_t) over a run, printed for the recipe.

    python scripts/table_2_residual.py [ENTRY ...]     (default: both Table 2 entries)
"""

from __future__ import annotations

import copy
import math
import sys

import torch

import zoo
from zoo.science.analysis.polynomial import regression_coefficient_table
from zoo.science.evaluation import rescore


def decay_factor(source) -> float:
    """exp(−wd Σ_t lr_t) for a cosine schedule from lr to final_lr (AdamW's shrinkage of a weight
    the loss does not reach)."""
    mean_lr = (source.lr + (source.final_lr or 0.0)) / 2
    return math.exp(-source.weight_decay * mean_lr * source.steps)


def main(names: list[str]) -> None:
    print("| entry | optimizer | steps | forget / memory / other neurons | test loss | x₁²y₁ x₂²y₁ x₃²y₁ | residual "
          "| after zeroing the forget neurons' y-inputs: test loss | x_i²y₁ | residual | AdamW shrink over the recipe |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        ckpt = zoo.load(name)
        model, task = ckpt.model, ckpt.task
        lam = model.lam().detach()
        forget = lam < 0.01
        counts = f"{int(forget.sum())} / {int((lam > 0.99).sum())} / {int(((lam >= 0.01) & (lam <= 0.99)).sum())}"
        before = regression_coefficient_table(model, task.d_x, task.d_y)
        loss = rescore(ckpt)["test_loss"]
        pruned = copy.deepcopy(model)
        with torch.no_grad():
            y = slice(task.d_x, task.d_x + task.d_y)  # the token's y-channels
            pruned.w_m_in[forget, y] = 0
            pruned.w_x_in[forget, y] = 0
        ckpt.model = pruned
        after = regression_coefficient_table(pruned, task.d_x, task.d_y)
        loss_after = rescore(ckpt)["test_loss"]
        coef = lambda t: " ".join(f"{t[f'x{i + 1}^2 y1']:.4f}" for i in range(task.d_x))  # noqa: E731
        source = ckpt.entry.source
        shrink = f"{decay_factor(source):.3f}" if source.optimizer == "adamw" else "— (L2 through Adam)"
        print(f"| {name} | {source.optimizer} | {ckpt.provenance.get('steps')} | {counts} | {loss:.6f} | {coef(before)} | "
              f"{before['residual norm']:.4f} | {loss_after:.6f} | {coef(after)} | {after['residual norm']:.4f} | {shrink} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["gated-rnn-zucchet-icl-b1", "gated-rnn-zucchet-icl"])
