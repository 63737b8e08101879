"""An unmodified PyTorch GAN-shaped loop with its own clock (issue 47, "several optimizers").

    python torch_gan.py ITERATIONS D_STEPS [never]

Per iteration: one batch of 12 from a DataLoader whose __getitem__ sleeps, D_STEPS discriminator optimizer
steps and one generator step.  never: a second optimizer is made and never steps (bad input), and the loop
steps the discriminator only.  Prints one JSON line: its iterations, samples, the iterations' time (from
asking for the batch to the end of the last optimizer step) and its input wait."""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 10 ** 6

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.randn(8)


torch.manual_seed(0)
iterations, d_steps = int(sys.argv[1]), int(sys.argv[2])
never = len(sys.argv) > 3 and sys.argv[3] == "never"
D = torch.nn.Linear(8, 1)
G = torch.nn.Linear(8, 8)
opt_d = torch.optim.SGD(D.parameters(), lr=0.01)
opt_g = torch.optim.SGD(G.parameters(), lr=0.01)
it = iter(DataLoader(Slow(), batch_size=12))
clock = time.perf_counter
train_s = wait_s = 0.0
samples = 0
for i in range(iterations):
    t0 = clock()
    x = next(it)
    t1 = clock()
    wait_s += t1 - t0
    samples += len(x)
    for _ in range(d_steps):
        opt_d.zero_grad()
        loss = D(G(x).detach()).mean() - D(x).mean()
        loss.backward()
        for _ in range(5):
            torch.mm(torch.randn(64, 64), torch.randn(64, 64))
        opt_d.step()
    if not never:
        opt_g.zero_grad()
        (-D(G(x)).mean()).backward()
        opt_g.step()
    train_s += clock() - t0
print(json.dumps({"iterations": iterations, "samples": samples, "train_s": train_s, "wait_s": wait_s,
                  "wait_share": wait_s / train_s}))
