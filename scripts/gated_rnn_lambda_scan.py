"""How flat is the ICL loss of a trained gated RNN in its memory neurons' λ?

Sets every memory neuron (λ > 1/2) of a checkpoint to a common λ = 1 − gap and scores 200k fresh
tasks (float64): as trained, with the readout D re-fitted by least squares, and with the best
single rescaling of the prediction (reports/zucchet-2023/table-2.md).
Usage: python scripts/gated_rnn_lambda_scan.py CHECKPOINT_FOLDER
"""

import sys

import torch

from zoo.storage.checkpoint import read_checkpoint

ckpt = read_checkpoint(sys.argv[1])
model, task = ckpt.model.double(), ckpt.task_spec.build()
batch = task.sample(200_000, seed=12345, dtype=torch.float64)
nu0 = model.nu.data.clone()
memory = torch.exp(-torch.exp(nu0)) > 0.5
r = model.readout
D0 = (r.sign * model.readout_matrix.data[r.start:r.stop]).clone()  # (d_y, gates)


def gates_at_query() -> torch.Tensor:
    u = model.input_gate(batch.tokens)  # (B, T, n)
    h, lam = u[:, 0], model.lam()
    for t in range(1, u.shape[1]):
        h = lam * h + u[:, t]
    return (h @ model.w_m_out.T) * (h @ model.w_x_out.T)  # (B, gates)


with torch.no_grad():
    for gap in [None, 0.01, 0.006, 0.004, 0.003, 0.002, 0.001, 0.0005, 0.0]:
        if gap is not None:
            nu = torch.full_like(nu0, -1e9 if gap == 0 else float(torch.log(-torch.log1p(torch.tensor(-gap)))))
            model.nu.data = torch.where(memory, nu, nu0)
        g = gates_at_query()
        pred = g @ D0.T
        G = g.T @ g
        D = torch.linalg.solve(G + 1e-12 * G.diagonal().mean() * torch.eye(len(G), dtype=G.dtype), g.T @ batch.targets).T
        c = (pred * batch.targets).sum() / (pred * pred).sum()
        loss = lambda p: float(0.5 * ((p - batch.targets) ** 2).mean())
        print(f"1 − λ = {'trained' if gap is None else gap}: loss {loss(pred):.6f}, D re-fitted {loss(g @ D.T):.6f}, "
              f"best scale {float(c):.5f} → {loss(c * pred):.6f}")
        model.nu.data = nu0.clone()
