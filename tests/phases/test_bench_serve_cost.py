"""benchmarks/_serve_cost.py measures what it says: every datagram it queues is received and accepted."""
import os
import subprocess
import sys

import pytest

from tests.procs import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "_serve_cost.py")


@pytest.mark.parametrize("pure", ["", "1"])
def test_serve_cost_receives_every_datagram(pure):
    # The script exits 1 unless the table accepted exactly the 3,200 datagrams it sent (one round).
    env = {k: v for k, v in os.environ.items() if k != "TEYE_PURE_PYTHON"}
    if pure:
        env["TEYE_PURE_PYTHON"] = pure
    out = subprocess.run([sys.executable, SCRIPT, REPO, "1"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 0 < float(out.stdout) < 10_000
