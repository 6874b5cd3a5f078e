"""Paper rows that need no training (issue 51, item 6): each function measures one claim and writes its raw
result to reports/<paper>/generated/<row>/results.json. Checkpoints are the released ones, data the frozen
splits (hash-checked on load) or fresh tasks from fixed seeds, arithmetic float64. No commit is recorded:
the files depend only on the release and the seeds.

    python scripts/paper_rows.py [ROW ...]     (default: every row)

Rows: zucchet-c2, zucchet-b2, sushma-propositions, blogpost-best-rate, blogpost-gd-construction.
The numeric checks behind each row are also tests: tests/test_paper_rows.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import zoo
from zoo.publishing.benchmark import best_eta, load_frozen
from zoo.science.models.gated_rnn import GatedLinearRNN, rnn_from_lsa, rnn_size
from zoo.science.models.gd_ssm import GDSSM, construct_gd_ssm
from zoo.science.models.lsa import LinearSelfAttention, gd_lsa_weights
from zoo.science.tasks.regression import (
    LinearRegressionTask,
    empirical_eta,
    gd_predict,
    line_search_eta,
    prefix_gd_predict,
)
from zoo.storage.locate import read_index

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64  # every tensor below is float64


def write(paper: str, row: str, result: dict) -> None:
    out = ROOT / "reports" / paper / "generated" / row / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


def split64(task_name: str, split: str):
    """(task, float64 batch of the frozen split, its SHA-256)."""
    _, task, frozen = load_frozen(task_name, split)
    b = frozen.batch(task)
    return task, task.batch_from_arrays(b.x.double(), b.y.double()), frozen.sha256


def bootstrap_eta_se(b64, resamples: int = 2000, seed: int = 0) -> float:
    """Standard error of the loss-optimal one-step rate η = Σ y·g / Σ g² (g: GD's prediction at rate 1) over
    the split's tasks, by resampling tasks with replacement."""
    g = gd_predict(b64, 1.0)
    num, den = (b64.query_targets * g).sum(1), (g * g).sum(1)  # per task
    n = num.shape[0]
    idx = torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(seed))
    return float((num[idx].sum(1) / den[idx].sum(1)).std())


def released(name: str) -> dict:
    row = read_index()["entries"][name]
    return {"entry": name, "test_loss": row["test_loss"], "gd_loss": row["gd_loss"], "gd_steps": row["gd_steps"],
            "relative_difference": row["test_loss"] / row["gd_loss"] - 1}


# ---------------------------------------------------------------- Zucchet et al., Appendix C.2
def trace_moments(d: int, n: int, draws: int, seed: int = 0) -> dict:
    """Monte Carlo Tr E[XXᵀ] and Tr E[XXᵀXXᵀ] for X (d × n) with i.i.d. U(−√3, √3) entries (σ² = 1), and the
    standard error of the second."""
    x = (torch.rand(draws, d, n, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 - 1) * 3**0.5
    s = x @ x.transpose(1, 2)
    t1, t2 = s.diagonal(dim1=1, dim2=2).sum(1), (s @ s).diagonal(dim1=1, dim2=2).sum(1)
    return {"tr_xx": float(t1.mean()), "tr_xxxx": float(t2.mean()), "tr_xxxx_se": float(t2.std() / draws**0.5)}


def zucchet_c2() -> dict:
    task, test, test_sha = split64("zucchet-icl", "test")
    _, val, val_sha = split64("zucchet-icl", "validation")
    n, d = task.n_context, task.d_x
    mc = trace_moments(d, n, draws=400_000)
    eta = task.analytic_eta()
    splits = {}
    for name, b, sha in (("test", test, test_sha), ("validation", val, val_sha)):
        closed, searched = empirical_eta(b), best_eta(task, b, 1)
        se = bootstrap_eta_se(b)
        splits[name] = {"sha256": sha, "w_variance": float(b.y.var() / b.x.var() / d),
                        "best_eta_closed_form": closed, "best_eta_line_search": searched, "bootstrap_se": se,
                        "analytic_minus_best_in_se": (eta - closed) / se,
                        "gd_loss_at_analytic_eta": task.loss(gd_predict(b, eta), b.query_targets).item(),
                        "gd_loss_at_best_eta": task.loss(gd_predict(b, closed), b.query_targets).item()}
    return {
        "claim": "Zucchet et al. Appendix C.2, Eq. 36: eta* = 1 / (sigma_x^2 (n + d_x - 1/5)); Table 2 prints 6.76e-2",
        "task": "zucchet-icl", "n": n, "d_x": d, "sigma_x2": task.x_variance,
        "analytic_eta": eta, "eq30_ratio_monte_carlo": mc["tr_xx"] / mc["tr_xxxx"],
        "monte_carlo": {**mc, "draws": 400_000, "seed": 0, "eq35_tr_xxxx": n * d * (n + d - 0.2),
                        "eq34_as_printed_tr_xxxx": 9 / 5 * n * d + n * (n - 1) * d + n * (d - 1)},
        "analytic_gd_loss_at_eta": task.analytic_gd_loss(), "splits": splits,
    }


# ---------------------------------------------------------------- Zucchet et al., Appendix B.2
def merge_rows(w_m: torch.Tensor, w_x: torch.Tensor, d: torch.Tensor) -> dict:
    """B.2, Eq. 20: gate rows J contribute hᵀ K_i h to output i, K_i = Σ_j D_ij W_m,j W_x,jᵀ. If every K_i is c_i
    times one rank-1 kernel u vᵀ, the rows are one row (u, v) read out with weights c. Returns (u, v, c) and how far
    the kernels are from that: σ₂/σ₁ of the stacked kernels (proportional across outputs) and of their common
    kernel (rank 1)."""
    kernels = torch.einsum("ij,jn,jm->inm", d, w_m, w_x)  # (outputs, hidden, hidden)
    _, s, vh = torch.linalg.svd(kernels.flatten(1), full_matrices=False)
    common = vh[0].view_as(kernels[0])
    uu, ss, vv = torch.linalg.svd(common)
    return {"u": uu[:, 0] * ss[0].sqrt(), "v": vv[0] * ss[0].sqrt(), "c": kernels.flatten(1) @ vh[0],
            "proportional": float(s[1] / s[0]) if len(s) > 1 else 0.0, "rank_one": float(ss[1] / ss[0])}


def b2_merge_on_a_construction(d: int = 4, seed: int = 0) -> dict:
    """The merge on the Figure 1 construction of a random d = 4 LSA: gate 0 (key-value neuron × query neuron) is
    split into three rows whose vectors each read both neuron groups and whose kernels cancel to the original
    one; merging the three finds one row again, one vector on key-value neurons and one on query neurons."""
    g = torch.Generator().manual_seed(seed)
    w_v, w_k, w_q = (torch.randn(d, d, generator=g, dtype=F64) for _ in range(3))
    readout = LinearRegressionTask(d_x=d, d_y=d, n_context=4).readout
    rnn = rnn_from_lsa(GatedLinearRNN(d, d, readout, **rnn_size(d)).double(), w_v, w_k, w_q).requires_grad_(False)
    h = torch.randn(512, rnn.hidden, generator=g, dtype=F64)  # any hidden states: the output map is a function of h alone
    w_m, w_x, dm = rnn.w_m_out, rnn.w_x_out, rnn.readout_matrix
    m0, x0 = w_m[0], w_x[0]
    w, z = torch.randn(2, rnn.hidden, generator=g, dtype=F64)  # directions on every neuron: the three rows mix groups
    split_m, split_x = torch.stack([m0 + w, w, -w]), torch.stack([x0, z, x0 + z])  # kernels sum to m0 x0ᵀ
    split_d = dm[:, :1].expand(-1, 3)
    merged = merge_rows(split_m, split_x, split_d)
    gated = lambda m, x, dd: ((h @ m.T) * (h @ x.T)) @ dd.T
    out_split = gated(torch.cat([split_m, w_m[1:]]), torch.cat([split_x, w_x[1:]]), torch.cat([split_d, dm[:, 1:]], 1))
    out_merged = gated(torch.cat([merged["u"][None], w_m[1:]]), torch.cat([merged["v"][None], w_x[1:]]),
                       torch.cat([merged["c"][:, None], dm[:, 1:]], 1))
    kv, q = rnn.lam() > 0.5, rnn.lam() < 0.5  # λ = 1 key-value neurons, λ = 0 query neurons
    off = lambda a, on: float(a[~on].norm() / a.norm())  # share of a vector's norm outside the group it should read
    return {"d": d, "seed": seed, "output_scale": float(out_split.abs().max()),
            "max_abs_output_change": float((out_merged - out_split).abs().max()),
            "max_abs_change_from_the_construction": float((out_merged - gated(w_m, w_x, dm)).abs().max()),
            "split_rows_m_share_off_kv": [off(r, kv) for r in split_m],
            "split_rows_x_share_off_query": [off(r, q) for r in split_x],
            "merged_u_share_off_kv": off(merged["u"], kv), "merged_v_share_off_query": off(merged["v"], q),
            "kernels_proportional_sigma2_over_sigma1": merged["proportional"],
            "common_kernel_rank_one_sigma2_over_sigma1": merged["rank_one"]}


def b2_student_row_structure(name: str = "gated-rnn-student-d4", share: float = 0.99) -> dict:
    """How many output-gating rows of the released student have the construction's structure: one vector on
    memory neurons (λ > 0.99), the other on forget neurons (λ < 0.01), each holding ≥ `share` of its row's
    squared norm. B.2 starts from a network where all rows but three do."""
    m = zoo.load(name).model.double().requires_grad_(False)
    lam = m.lam()
    mem, fog = lam > 0.99, lam < 0.01
    frac = lambda w, mask: (w[:, mask] ** 2).sum(1) / (w**2).sum(1).clamp_min(1e-300)
    a = torch.maximum(frac(m.w_m_out, mem) * frac(m.w_x_out, fog), frac(m.w_m_out, fog) * frac(m.w_x_out, mem))
    live = m.readout_matrix.abs().sum(0) > 0
    return {"entry": name, "memory_neurons": int(mem.sum()), "forget_neurons": int(fog.sum()),
            "leaky_neurons": int((~mem & ~fog).sum()), "gates": m.gates, "gates_read_out": int(live.sum()),
            "rows_with_structure": int((a >= share**2).sum()), "share": share,
            "best_row_structure_share": float(a.max()), "median_row_structure_share": float(a.median())}


def zucchet_b2() -> dict:
    return {"claim": "Zucchet et al. Appendix B.2 / Figure 2.C: three output-gating rows of the pruned student "
                     "combine into kernels proportional across outputs and of rank 1, reducible to one row",
            "merge_on_construction": b2_merge_on_a_construction(), "released_student": b2_student_row_structure()}


# ---------------------------------------------------------------- Sushma, Tian et al., Propositions 1-3 and A.4
def gd_ssm(task: LinearRegressionTask, n_layers: int = 1, ridge: float = 0.0, eta: float = 0.05) -> GDSSM:
    dims = {"window": 1, "value_dim": task.d_x, "key_dim": 1} if task.layout == "products" else \
        {"window": 3, "value_dim": task.d_y, "key_dim": task.d_x}
    model = GDSSM(task.token_dim, task.d_y, task.readout, n_layers=n_layers, ridge=ridge, **dims).double()
    return construct_gd_ssm(model, task.layout, task.d_x, task.d_y, eta).requires_grad_(False)


def prefix_gd(b, eta: float, steps: int, ridge: float = 0.0) -> torch.Tensor:
    """W_steps(prefix t) x_{t+1} for t = 1..C: `steps` GD steps (with ridge) on the first t examples. (B, C, d_y)"""
    preds = []
    for t in range(1, b.x.shape[1]):  # the first t examples (0-based rows 0..t−1), then the next input x[:, t]
        sub = LinearRegressionTask(d_x=b.x.shape[-1], d_y=b.y.shape[-1], n_context=t).batch_from_arrays(
            b.x[:, : t + 1], b.y[:, : t + 1])
        preds.append(gd_predict(sub, eta, steps, ridge))
    return torch.stack(preds, 1)


def every_position_error(task: LinearRegressionTask, n_layers: int, ridge: float, eta: float, seed: int,
                         n_tasks: int = 256) -> dict:
    """Largest |construction − GD| over every position where the paper's proposition says a prediction is made:
    every token of the 'products' layout, every x token after the first of the 'interleaved' one."""
    b = task.sample(n_tasks, seed=seed, dtype=torch.float64)
    out = gd_ssm(task, n_layers, ridge, eta)(b.tokens)  # (B, T, d_y)
    if task.layout == "products":
        ours, ref = out, prefix_gd_predict(b, torch.full((task.n_context,), eta, dtype=F64))
    else:
        ours, ref = out[:, 2::2], prefix_gd(b, eta, n_layers, ridge)  # x tokens x_2..x_{C+1}
    y_tokens = float(out[:, 1::2].abs().max()) if task.layout == "interleaved" else None  # "products" has none
    return {"layout": task.layout, "d_x": task.d_x, "d_y": task.d_y, "n_context": task.n_context, "layers": n_layers,
            "ridge": ridge, "eta": eta, "seed": seed, "positions": ours.shape[1],
            "max_abs_error": float((ours - ref).abs().max()), "prediction_scale": float(ref.abs().max()),
            "max_abs_output_at_y_tokens": y_tokens}


def sushma_propositions() -> dict:
    products = [LinearRegressionTask(d_x=f, n_context=n, layout="products") for f, n in ((10, 10), (3, 25))]
    nd = [LinearRegressionTask(d_x=5, d_y=5, n_context=10, layout="interleaved"),
          LinearRegressionTask(d_x=5, d_y=3, n_context=10, layout="interleaved")]
    prop1 = [every_position_error(t, 1, 0.0, 0.05, seed=10 + i) for i, t in enumerate(products)]
    prop2 = [every_position_error(t, 1, 0.0, 0.05, seed=20 + i) for i, t in enumerate(nd)]
    prop3 = [every_position_error(t, k, 0.0, 0.05, seed=30 + 10 * i + k) for i, t in enumerate(nd) for k in (2, 3)]
    a4 = [every_position_error(nd[0], k, rho, 0.05, seed=60 + k) for k in (1, 2, 3) for rho in (0.5, 1.0, 20.0)]
    # A.4's "without changing the recurrence structure": the ridge construction's parameters are the plain one's
    plain, ridged = gd_ssm(nd[0], 2), gd_ssm(nd[0], 2, ridge=1.0)
    same = all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(), ridged.state_dict().values()))
    shapes = plain.state_shapes() == ridged.state_shapes()
    # A.4's printed update: ΔW = −(η/N)(W Z̃ − Z + W) is GD on (1/2N)Σ‖y − Wx‖² + (1/2N)‖W‖², i.e. ρ = 1 in the
    # zoo's summed convention; GD on the loss A.4 prints, (1/2N)Σ‖·‖² + ‖W‖², needs ρ = 2N.
    b = nd[0].sample(256, seed=50, dtype=torch.float64)
    n = nd[0].n_context
    printed = float((gd_predict(b, 0.05, 2, ridge=1.0) - gd_predict(b, 0.05, 2, ridge=2.0 * n)).abs().max())
    return {"claim": "Sushma, Tian et al. Propositions 1-3 and Appendix A.4: the constructed GD-SSM's output at every "
                     "token is the (L-step, ridge-regularised) GD prediction for the next input",
            "proposition_1": prop1, "proposition_2": prop2, "proposition_3": prop3, "a4_ridge": a4,
            "a4_same_parameters_and_state_with_and_without_ridge": same and shapes,
            "a4_printed_update_vs_printed_loss_max_abs_prediction_gap": printed,
            "released": [released(e) for e in ("gd-ssm-gd-1d", "gd-ssm-gd-nd", "gd-ssm-gd-nd-2step",
                                               "gd-ssm-gd-nd-ridge-2step")]}


# ---------------------------------------------------------------- blogpost, the GD construction ("Main result")
def random_orthogonal(d: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def lsa_with(weights: dict, d: int) -> LinearSelfAttention:
    """One LSA layer over all context tokens (the blogpost's layer: no causal mask, the query is not a key)."""
    model = LinearSelfAttention(d, LinearRegressionTask(d_x=d - 1, n_context=2).readout, attention="context").double()
    with torch.no_grad():
        for name, value in weights.items():
            getattr(model.layers[0], name).copy_(value)
    return model.requires_grad_(False)


def token_dynamics_error(d_x: int, c: int, eta: float, seed: int) -> dict:
    """The blogpost's Main result at W_0 ≠ 0: every token (context and query) leaves the layer as
    (x_j, y_j − ΔW x_j), ΔW = W_1 − W_0 the GD step on the context; then the loss of W_0 on the new context
    equals the loss of W_1 on the old one."""
    task = LinearRegressionTask(d_x=d_x, n_context=c)
    g = torch.Generator().manual_seed(seed)
    b = task.sample(256, generator=g, dtype=torch.float64)
    w0 = torch.randn(1, d_x, generator=g, dtype=F64)
    out = lsa_with(gd_lsa_weights(d_x, 1, eta, w0), d_x + 1)(b.tokens)  # (B, C+1, d_x+1)
    x, y_in = b.x, b.tokens[..., d_x:]
    xc, yc = b.x_context, b.y_context
    w1 = w0 + eta * ((yc - xc @ w0.T).transpose(1, 2) @ xc)  # one GD step from W_0 on ½Σ‖y − Wx‖²
    expected = torch.cat([x, y_in - x @ (w1 - w0).transpose(1, 2)], -1)
    loss = lambda w, xs, ys: 0.5 * ((ys - xs @ w.transpose(-1, -2)) ** 2).sum((1, 2))
    query_at_w0_zero = -lsa_with(gd_lsa_weights(d_x, 1, eta), d_x + 1)(b.tokens)[:, -1, d_x:]  # minus ŷ, θ_GD's sign
    return {"d_x": d_x, "n_context": c, "eta": eta, "seed": seed,
            "max_abs_token_error": float((out - expected).abs().max()), "token_scale": float(expected.abs().max()),
            "max_abs_loss_identity_error": float((loss(w0, xc, out[:, :-1, d_x:]) - loss(w1, xc, yc)).abs().max()),
            "query_prediction_error_vs_gd_at_w0_zero": float((query_at_w0_zero - gd_predict(b, eta)).abs().max())}


def rotation_note(d_x: int = 5, c: int = 10, eta: float = 0.1, seed: int = 0) -> dict:
    """The blogpost's note: 'we could have chosen W^V = W^V R and W^K = W^K R ... and the dynamics would have been
    the same'. Measured as printed, and with the rotation on the key/query side (R W^K, R W^Q)."""
    task = LinearRegressionTask(d_x=d_x, n_context=c)
    g = torch.Generator().manual_seed(seed)
    b = task.sample(256, generator=g, dtype=torch.float64)
    r = random_orthogonal(d_x + 1, g)
    base = gd_lsa_weights(d_x, 1, eta)
    ref = lsa_with(base, d_x + 1)(b.tokens)
    printed = lsa_with({**base, "w_v": base["w_v"] @ r, "w_k": base["w_k"] @ r}, d_x + 1)(b.tokens)
    keyside = lsa_with({**base, "w_k": r @ base["w_k"], "w_q": r @ base["w_q"]}, d_x + 1)(b.tokens)
    rel = lambda a: float((a - ref).norm() / ref.norm())
    return {"d_x": d_x, "n_context": c, "eta": eta, "seed": seed, "relative_change_as_printed": rel(printed),
            "relative_change_key_query_rotation": rel(keyside)}


def blogpost_gd_construction() -> dict:
    checks = [token_dynamics_error(d, c, eta, seed) for seed, (d, c, eta) in
              enumerate(((5, 10, 0.1), (10, 10, 0.15), (3, 50, 0.02), (10, 100, 0.01)))]
    return {"claim": "blogpost, 'Building a linear transformer that implements a gradient descent step', Main result",
            "fresh_tasks_float64": checks, "rotation_note": rotation_note(),
            "released": [released(e) for e in ("lsa-gd-d10-c10", "lsa-gd-d10-c10-half", "lsa-gd-zucchet-icl",
                                               "lsa-gd-2step-d10-c10", "lsa-gd-3step-d10-c10")]}


# ---------------------------------------------------------------- blogpost, the analytical best rate
def blog_eta(b64, start: int) -> float:
    """The blogpost's closed form (its sum over tasks from n = `start`: printed from 1, derived from 0), in the
    zoo's summed-loss convention (the blogpost's η on the mean loss is C times it)."""
    g = gd_predict(b64, 1.0)[start:]
    return float((b64.query_targets[start:] * g).sum() / (g * g).sum())


def theta_gd_line_search(task, b64, iters: int = 100) -> float:
    """The blogpost's line search: the η minimising the constructed transformer's own loss L(θ_GD) on the split."""
    d = task.d_x + task.d_y
    model = LinearSelfAttention(d, task.readout, attention="strict_causal").double().requires_grad_(False)

    def loss(eta: float) -> float:
        with torch.no_grad():
            for name, value in gd_lsa_weights(task.d_x, task.d_y, eta).items():
                getattr(model.layers[0], name).copy_(value)
        return task.loss(model.predict(b64.tokens), b64.query_targets).item()

    return line_search_eta(loss, 0.0, 2.5 * task.analytic_eta(), iters)


def trained_rate(name: str) -> dict:
    """The GD rate a released trained one-layer LSA implements: the η whose one-step GD predictions are closest
    (least squares over the split's tasks) to the model's, against the analytic η* and the split's best rate."""
    ckpt = zoo.load(name)
    task, b, sha = split64(ckpt.entry.task, "test")
    model = ckpt.model.double().requires_grad_(False)
    pred, g = model.predict(b.tokens), gd_predict(b, 1.0)
    closest = float((pred * g).sum() / (g * g).sum())
    residual = float(((pred - closest * g) ** 2).sum() / (pred**2).sum())
    eta, best, se = task.analytic_eta(), empirical_eta(b), bootstrap_eta_se(b)
    poly = ckpt.metrics.get("polynomial") or {}
    coef = [v for k, v in poly.items() if k.endswith("^2 y1")]
    return {"entry": name, "task": ckpt.entry.task, "split_sha256": sha, "steps": ckpt.provenance.get("steps"),
            "closest_eta": closest, "unexplained_share_of_prediction": residual, "analytic_eta": eta,
            "closest_vs_analytic": closest / eta - 1, "split_best_eta": best, "split_best_eta_bootstrap_se": se,
            "closest_vs_split_best": closest / best - 1,
            "polynomial_xi2_y1": {"min": min(coef), "max": max(coef), "mean": sum(coef) / len(coef)} if coef else None,
            "analytic_gd_loss": {"at_analytic_eta": task.analytic_gd_loss(),
                                 "at_closest_eta": task.analytic_gd_loss(closest)}}


def blogpost_best_rate() -> dict:
    task, b, sha = split64("linreg-d10-c10", "test")
    closed_seconds = []
    for _ in range(5):  # the fastest of 5: the machine is shared
        t0 = time.perf_counter()
        closed = blog_eta(b, 0)
        closed_seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    searched = theta_gd_line_search(task, b)
    search_seconds = time.perf_counter() - t0
    c = task.n_context
    return {"claim": "blogpost, 'Analytical derivation of the best GD learning rate'",
            "task": "linreg-d10-c10", "split": "test", "split_sha256": sha,
            "closed_form_eta": closed, "closed_form_eta_as_printed_from_n_1": blog_eta(b, 1),
            "closed_form_eta_blog_units": closed * c, "line_search_eta_theta_gd": searched,
            "line_search_vs_closed_form": searched / closed - 1, "analytic_eta": task.analytic_eta(),
            "seconds": {"closed_form_fastest_of_5": min(closed_seconds),
                        "line_search_100_golden_section_steps": search_seconds,
                        "device": "CPU, 2-core dev machine shared with other jobs (timings vary between runs)"},
            "trained": [trained_rate(n) for n in ("lsa-d10-c10", "lsa-1l-gdssm-1d")]}


ROWS = {
    "zucchet-c2": ("zucchet-2023", "appendix-c2", zucchet_c2),
    "zucchet-b2": ("zucchet-2023", "appendix-b2", zucchet_b2),
    "sushma-propositions": ("sushma-tian-2024", "propositions", sushma_propositions),
    "blogpost-best-rate": ("blogpost-2024", "best-rate", blogpost_best_rate),
    "blogpost-gd-construction": ("blogpost-2024", "gd-construction", blogpost_gd_construction),
}

if __name__ == "__main__":
    for key in sys.argv[1:] or ROWS:
        paper, row, run = ROWS[key]
        write(paper, row, run())
