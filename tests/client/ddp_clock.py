"""The data-parallel test scripts' own clock (torch_ddp_ranks.py, torch_ddp_bad.py): what a rank's backward
and SGD update take alone, on a copy of its model that exchanges nothing."""
import copy
import time

import torch


def alone_seconds(net, x, y, rounds=15, lr=0.01):
    """The median over ``rounds`` of one backward and SGD update of a copy of ``net`` on (x, y), by hand (an
    optimizer's step would be a training step of the job): a rank's time in backward() and step() without
    waiting for the others."""
    ref = copy.deepcopy(net)
    times = []
    for _ in range(rounds):
        loss = ((ref(x) - y) ** 2).mean()
        t0 = time.monotonic()
        ps = list(ref.parameters())
        grads = torch.autograd.grad(loss, ps, allow_unused=True)
        with torch.no_grad():
            for p, g in zip(ps, grads):
                if g is not None:
                    p.sub_(lr * g)
        times.append(time.monotonic() - t0)
    return sorted(times)[len(times) // 2]
