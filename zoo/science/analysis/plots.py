"""Figures for model cards: loss curves and weight matrices (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def finish(fig, ax, path: Path, *, xlabel: str, ylabel: str = "test loss  (½·MSE)", title: str = "",
           title_size: float | None = None, legend_size: float = 8, grid: bool = True, dpi: int | None = None) -> Path:
    """Label, legend and save a one-axes figure, then free it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    if grid:
        ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, **({"dpi": dpi} if dpi else {}))
    plt.close(fig)
    return path


def save(fig, path: Path, dpi: int = 120) -> Path:
    """Lay out, write (creating the folder) and free a figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def loss_curve(history: list[dict], path: Path, *, gd_loss: float | None = None, gd_steps: int = 1, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    trained = [h for h in history if h["train_loss"] is not None]  # None: every step of the row was skipped (non-finite)
    ax.plot([h["step"] for h in trained], [h["train_loss"] for h in trained], label="train (fresh tasks)")
    if any("val_loss" in h for h in history):
        ax.plot([h["step"] for h in history if "val_loss" in h], [h["val_loss"] for h in history if "val_loss" in h],
                label="validation (frozen split)")
    if gd_loss is not None:
        steps_label = "one GD step" if gd_steps == 1 else f"{gd_steps} GD steps"
        ax.axhline(gd_loss, color="k", ls="--", lw=1, label=f"{steps_label} ({gd_loss:.4g})")
    ax.set_yscale("log")
    return finish(fig, ax, path, xlabel="step", ylabel="loss  (½·MSE)", title=title, title_size=9)


ALIGNMENT_CURVES = {  # history key → legend: the blogpost's Figure 10 metrics (zoo.science.evaluation.alignment)
    "pred_l2_to_gd": "L2 error (predictions)",
    "sensitivity_l2_to_gd": "L2 error (gradients)",
}


def alignment_curve(history: list[dict], path: Path, *, gd_steps: int = 1, title: str = "") -> Path:
    """The blogpost's Figure 10 from a history recorded with `track_alignment`: the two L2 errors to
    GD (left, log; sums of squares per task, zoo.science.evaluation.alignment) and the sensitivity cosine
    (right) against the training step."""
    rows = [h for h in history if "pred_l2_to_gd" in h]
    steps = [h["step"] for h in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for key, label in ALIGNMENT_CURVES.items():
        ax.plot(steps, [h[key] for h in rows], label=label)
    ax.set_yscale("log")
    right = ax.twinx()
    right.plot(steps, [h["sensitivity_cosine"] for h in rows], color="k", lw=1, label="cosine (gradients)")
    right.set_ylabel("cosine")
    right.set_ylim(min(0.0, min(h["sensitivity_cosine"] for h in rows)), 1.02)
    right.legend(fontsize=8, loc="center right")
    target = "one GD step" if gd_steps == 1 else f"{gd_steps} GD steps"
    return finish(fig, ax, path, xlabel="step", ylabel=f"L2 error to {target}  (validation)", title=title, title_size=9)


def weight_matrices(matrices: dict[str, torch.Tensor], path: Path, *, title: str = "") -> Path:
    """One heat-map per named matrix, shared symmetric colour scale per panel."""
    n = len(matrices)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), dpi=120, squeeze=False)
    for ax, (name, m) in zip(axes.flat, matrices.items()):
        m = m.detach().double().cpu()
        lim = float(m.abs().max()) or 1.0
        im = ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto" if min(m.shape) < 3 else "equal")
        ax.set_title(name, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def gd_ssm_kernel_figure(result: dict, path: Path, *, title: str = "") -> Path:
    """Trained against constructed GD-SSM kernels (zoo/science/analysis/gd_ssm_kernels.py): K, each V_k
    and Λ, in the construction's gauge, with their cosines in the panel titles."""
    m = result["matrices"]
    panels = {f"K trained (cos {result['key_cosine']:.4f})": m["K"], "K construction": m["K_construction"]}
    for k, cos in enumerate(result["value_cosine"][:3]):  # three outputs are enough to see the pattern
        panels[f"V_{k} trained (cos {cos:.4f})"] = m["V"][k]
        panels[f"V_{k} construction"] = m["V_construction"][k]
    panels[f"Λ trained (mean {result['lambda_mean']:.4f})"] = m["lambda"]
    return weight_matrices(panels, Path(path), title=f"{title}  function-tensor cosine {result['tensor_cosine']:.4f}")


def gd_rate_figure(result: dict, path: Path, *, title: str = "") -> Path:
    """Blogpost Figure 12: prediction and input-gradient L2 to one GD step, and their cosine,
    against the GD rate η, with the closest η, the loss-optimal η and the analytic η* marked."""
    curve = result["curve"]
    eta = [r["eta"] for r in curve]
    fig, (ax_l2, ax_cos) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_l2.plot(eta, [r["pred_l2_to_gd"] for r in curve], "o-", ms=3, label="prediction L2")
    ax_l2.plot(eta, [r["sensitivity_l2_to_gd"] for r in curve], "s-", ms=3, label="input-gradient L2")
    ax_l2.set_yscale("log")
    ax_cos.plot(eta, [r["sensitivity_cosine"] for r in curve], "o-", ms=3, color="C2", label="model cosine")
    ax_cos.set_ylim(min(0.9, *(r["sensitivity_cosine"] for r in curve)), 1.005)
    marks = (("closest_eta", "closest GD", "k", "-"), ("loss_eta", "loss-optimal η", "C3", "--"),
             ("analytic_eta", "analytic η*", "C4", ":"))
    for ax in (ax_l2, ax_cos):
        for key, label, color, ls in marks:
            ax.axvline(result[key], color=color, ls=ls, lw=1, label=f"{label} {result[key]:.4f}")
        ax.set_xlabel("GD learning rate η")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_l2.set_title(f"{title}: distance to one GD step", fontsize=9)
    ax_cos.set_title("cosine of the input-gradients (scale-free)", fontsize=9)
    return save(fig, path)


def loop_curve_figure(rows: list[dict], path: Path, *, title: str = "") -> Path:
    """Test loss of a looped one-layer LSA vs the number of applications K, one line per
    dampening λ, beside K GD steps at rate λη (dashed); non-finite losses are drawn at the top."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    finite = [r[k] for r in rows for k in ("test_loss", "gd_loss") if r[k] == r[k] and abs(r[k]) < 1e6]
    ceiling = 10 * max(finite) if finite else 1.0
    for i, damping in enumerate(sorted({r["damping"] for r in rows}, reverse=True)):
        sel = sorted((r for r in rows if r["damping"] == damping), key=lambda r: r["loops"])
        k = [r["loops"] for r in sel]
        clip = [min(r["test_loss"], ceiling) if r["test_loss"] == r["test_loss"] else ceiling for r in sel]
        ax.plot(k, clip, "o-", color=f"C{i}", label=f"model, λ = {damping:g}")
        ax.plot(k, [min(r["gd_loss"], ceiling) for r in sel], "--", color=f"C{i}", alpha=0.7, label=f"GD, rate {damping:g}η*")
    ax.set_yscale("log")
    ax.set_xlabel("applications K")
    ax.set_ylabel("test loss (clipped at the top)")
    ax.set_title(title or "looped LSA")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


POSITION_AXIS = "examples seen t (predicting y_{t+1})"
POSITION_CURVES = {  # metric key → (label, style)
    "position_loss": ("this model", dict(color="C0", lw=2)),
    "position_gd_loss": ("one GD step on the prefix, η*_t", dict(color="k", ls="--", lw=1)),
    "position_gd_fixed_loss": ("one GD step on the prefix, fixed η*_C", dict(color="0.5", ls=":", lw=1)),
    "position_online_gd_loss": ("online GD (delta rule), η = 1/(σ²d)", dict(color="C2", ls="-.", lw=1)),
    "position_lstsq_loss": ("least squares on the prefix", dict(color="C3", ls="--", lw=1)),
}


def position_curve(metrics: dict, path: Path, *, title: str = "") -> Path:
    """Loss of the prediction of y_{t+1} made after t examples, against t, beside the baselines."""
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for key, (label, style) in POSITION_CURVES.items():
        if key in metrics:
            values = metrics[key]
            ax.plot(range(1, len(values) + 1), values, label=label, **style)
    ax.set_yscale("log")
    # noise-free least squares is exact (~1e-15) once t ≥ d_x: keep the scale on the other curves
    floor = min(min(metrics[k]) for k in POSITION_CURVES if k in metrics and k != "position_lstsq_loss")
    ax.set_ylim(bottom=floor / 3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return finish(fig, ax, path, xlabel=POSITION_AXIS, title=title, title_size=9, legend_size=7)
