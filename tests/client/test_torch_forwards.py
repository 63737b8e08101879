"""Where the forward is seen (teye_client._torch._Forwards, issue 47's cost on the training thread): PyTorch's
global module hooks for the first steps, then hooks on the modules called outermost alone, so that the modules
they call take nn.Module's fast path again; a forward of another module brings the global hooks back.  The
oracle is the test's own count of the modules it calls, in a real PyTorch."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch extra (./dev.sh test installs it)")

import torch.nn.modules.module as mm  # noqa: E402

from teye_client import _torch  # noqa: E402


def _net(blocks):
    return torch.nn.Sequential(*[m for _ in range(blocks) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())])


class Seen:
    """What teye's hooks do, reduced to counting: each call seen, and the outermost ones told to _Forwards."""

    def __init__(self):
        self.calls = 0
        self.depth = 0
        self.fw = None

    def pre(self, mod, args):
        self.calls += 1
        if self.depth == 0:
            self.fw.began(mod)
        self.depth += 1

    def post(self, mod, args, out):
        self.depth -= 1


@pytest.fixture
def seen(monkeypatch):
    # (no compilation seen: another test in this process may have fired teye's compile callback, which holds
    # every process's hooks as they are, test_after_a_compilation_the_hooks_stay_as_they_are)
    monkeypatch.setattr(_torch, "compiled", [False])
    s = Seen()
    s.fw = _torch._Forwards(s.pre, s.post, mm.register_module_forward_pre_hook, mm.register_module_forward_hook)
    s.fw.install_global()
    yield s
    for h in s.fw.handles:
        h.remove()


def _ours(s):
    return ([f for f in mm._global_forward_pre_hooks.values() if f == s.pre],
            [f for f in mm._global_forward_hooks.values() if f == s.post])


def test_the_hooks_narrow_to_the_outermost_modules_and_the_others_run_unhooked(seen):
    model, loss = _net(20), torch.nn.MSELoss()   # 41 modules called per forward, and a loss module beside it
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    for step in range(_torch.NARROW_AFTER):
        assert not seen.fw.narrowed and _ours(seen) != ([], [])
        seen.calls = 0
        loss(model(x), y)
        assert seen.calls == 41 + 1             # every module's call, through the global hooks
        seen.fw.tick()
    assert seen.fw.narrowed and seen.fw.narrowings == 1
    assert _ours(seen) == ([], [])              # the global tables hold nothing of ours: the fast path again
    for _ in range(3):
        seen.calls = 0
        loss(model(x), y)
        assert seen.calls == 2                  # the model and the loss module, each outermost
        seen.fw.tick()
    assert seen.fw.narrowed and seen.fw.widenings == 0


def test_a_step_without_a_forward_of_the_roots_brings_the_global_hooks_back(seen):
    """Bad input: the job swaps its model after the hooks narrowed (a fresh copy, a wrapper made later): the
    first step that sees no forward widens them again, and they narrow to the new model."""
    old, new = _net(3), _net(3)
    x = torch.randn(2, 4)
    for _ in range(_torch.NARROW_AFTER):
        old(x)
        seen.fw.tick()
    assert seen.fw.narrowed
    seen.calls = 0
    new(x)
    assert seen.calls == 0                      # not seen: its hooks are not there
    seen.fw.tick()
    assert not seen.fw.narrowed and seen.fw.widenings == 1 and _ours(seen) != ([], [])
    for _ in range(_torch.NARROW_AFTER):
        seen.calls = 0
        new(x)
        assert seen.calls == 7
        seen.fw.tick()
    assert seen.fw.narrowed and seen.fw.narrowings == 2
    seen.calls = 0
    new(x)
    assert seen.calls == 1


def test_too_many_outermost_modules_keep_the_global_hooks(seen):
    """A loop that calls more than MAX_ROOTS modules outermost (its layers one by one): the global hooks stay."""
    layers = [torch.nn.Linear(4, 4) for _ in range(_torch.MAX_ROOTS + 1)]
    x = torch.randn(2, 4)
    for _ in range(2 * _torch.NARROW_AFTER):
        for m in layers:
            x = m(x).detach()
        seen.fw.tick()
    assert not seen.fw.narrowed and seen.fw.narrowings == 0 and _ours(seen) != ([], [])


def test_after_a_compilation_the_hooks_stay_as_they_are(seen, monkeypatch):
    """torch.compile guards a compiled graph on the hook tables it read: once a compilation began, the hooks
    neither narrow (still learning) nor widen (narrowed), whatever the steps see."""
    model = _net(3)
    x = torch.randn(2, 4)
    monkeypatch.setattr(_torch, "compiled", [True])
    for _ in range(2 * _torch.NARROW_AFTER):
        model(x)
        seen.fw.tick()
    assert not seen.fw.narrowed and _ours(seen) != ([], [])
    monkeypatch.setattr(_torch, "compiled", [False])
    for _ in range(_torch.NARROW_AFTER):
        model(x)
        seen.fw.tick()
    assert seen.fw.narrowed
    monkeypatch.setattr(_torch, "compiled", [True])
    seen.fw.tick()                              # a step without the model's forward: it would widen
    assert seen.fw.narrowed and seen.fw.widenings == 0
