"""Does a 1-D GD-SSM trained from a random init leave the zero-predictor plateau? (the probes behind
`arch.beta_init` / `arch.zero_output`; reports/sushma-tian-2024/figure-1c.md)

    python scripts/gd_ssm_plateau_probe.py --f 20 --beta-init 1 --zero-output --steps 30000 --seed 1

Adam (ν at half the lr), batch 64, 200-step warm-up then cosine (or a constant lr), one thread.
Prints one GD step's and the zero predictor's loss on a 4096-task validation set, then the
model's loss on it 20 times during training.
"""

import argparse
import math
import time

import torch

from zoo.science.models import create_model
from zoo.science.registry import get_entry, get_task_spec, with_overrides
from zoo.science.tasks.regression import empirical_eta, gd_predict

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--f", type=int, default=20, help="feature dimension d_x")
parser.add_argument("--init-std", type=float, default=None, help="arch.init_std (default 1/sqrt(2f + 1))")
parser.add_argument("--beta-init", type=float, default=0.1)
parser.add_argument("--zero-output", action="store_true", help="D = 0 at init")
parser.add_argument("--key-dim", type=int, default=1)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--steps", type=int, default=30000)
parser.add_argument("--constant-lr", action="store_true", help="no warm-up or cosine")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.set_num_threads(1)
overrides = {"task.d_x": args.f, "arch.key_dim": args.key_dim, "arch.beta_init": args.beta_init,
             "arch.zero_output": args.zero_output}
if args.init_std:
    overrides["arch.init_std"] = args.init_std
entry = with_overrides(get_entry("gd-ssm-1d"), overrides)
task = get_task_spec(entry.task).build()
torch.manual_seed(args.seed)
model = create_model(entry.arch, task)

recurrent = model.recurrent_parameter_names()
params = dict(model.named_parameters())
optimizer = torch.optim.Adam([
    {"params": [p for n, p in params.items() if n not in recurrent], "lr": args.lr},
    {"params": [p for n, p in params.items() if n in recurrent], "lr": args.lr / 2},
])
if args.constant_lr:
    schedule = None
else:
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1, (s + 1) / 200)
                                                 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))

generator = torch.Generator().manual_seed(1000 + args.seed)
validation = task.sample(4096, seed=123)
reference = task.sample(4096, seed=123, dtype=torch.float64)
eta = empirical_eta(task.sample(20000, seed=1, dtype=torch.float64))
print(f"one GD step {task.loss(gd_predict(reference, eta), reference.targets).item():.4f}, "
      f"zero predictor {task.loss(0 * reference.targets, reference.targets).item():.4f}")
start = time.time()
for step in range(args.steps + 1):
    batch = task.sample(64, generator=generator)
    loss = task.loss(task.readout(model(batch.tokens)), batch.targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if schedule is not None:
        schedule.step()
    if step % (args.steps // 20) == 0:
        with torch.no_grad():
            val = task.loss(task.readout(model(validation.tokens)), validation.targets).item()
        print(f"{step:6d}  validation {val:.4f}  ({time.time() - start:.0f} s)", flush=True)
