"""`zoo quickstart`: the zoo end to end on CPU in a few minutes, saying what it does."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

console = Console()


def say(msg: str) -> None:
    console.print(f"[bold cyan]▶[/] {msg}")


def run(out: Path, steps: int = 1500) -> dict:
    import zoo

    out = Path(out)
    summary = {}
    say(f"registry: {len(zoo.list_entries())} entries (zoo list)")

    say("constructing θ_GD on Zucchet et al.'s ICL task (zoo build lsa-gd-zucchet-icl)")
    gd = zoo.build("lsa-gd-zucchet-icl", out / "lsa-gd-zucchet-icl")
    m = gd.metrics
    console.print(f"  analytic η* = {gd.construction['eta']:.5f}  (paper: 1/(T+d_x−1/5) = 0.06757)")
    console.print(f"  one-step-GD test loss = {m['test_loss']:.4f}  (paper: 0.0947; {m['n_tasks']} frozen test tasks)")
    summary["gd_zucchet"] = m

    say(f"training a 1-layer LSA on D=10, C=10 for {steps} steps on CPU (zoo build lsa-d10-c10 --steps {steps})")
    lsa = zoo.build("lsa-d10-c10", out / "lsa-d10-c10", steps=steps, device="cpu")
    m = lsa.metrics
    console.print(f"  test loss {m['test_loss']:.4f} vs θ_GD {m['gd_loss']:.4f} "
                  f"(gap {100 * (m['test_loss'] / m['gd_loss'] - 1):+.2f}%), least squares {m['lstsq_loss']:.2g}")
    console.print(f"  sensitivity cosine to θ_GD {m['sensitivity_cosine']:.4f}, prediction L2 gap {m['pred_l2_to_gd']:.3g}")
    summary["lsa_trained"] = m

    say(f"reloading {out / 'lsa-d10-c10'} (hashes and shapes verified)")
    again = zoo.load(out / "lsa-d10-c10")
    fresh = again.task.sample(4, seed=0)
    pred = again.model.predict(fresh.tokens).squeeze(-1)
    for p, t in zip(pred.tolist(), fresh.targets.squeeze(-1).tolist()):
        console.print(f"  fresh task: predicted {p:+.3f}, true {t:+.3f}")
    console.print(f"[green]done[/] — checkpoints with model cards in {out}/")
    return summary
