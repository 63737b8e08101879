"""On a machine with an NVIDIA GPU: our live NVML readings agree with nvidia-smi on the same device."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from agent.context import AgentContext
from agent.gpu.nvml import load_pynvml
from agent.gpu.source import GpuSource

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)")]


def _smi():
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60, check=True)
    rows = {}
    for line in out.stdout.strip().splitlines():
        idx, uuid, util, used, total, power = [f.strip() for f in line.split(",")]
        rows[idx] = dict(uuid=uuid, util=float(util), used=float(used), total=float(total),
                         power=None if "N/A" in power else float(power))
    return rows


def test_utilization_memory_and_power_match_nvidia_smi():
    src = GpuSource(load_pynvml, ctx=AgentContext(), events=False, processes=False)
    try:
        ours = src.collect()
        smi = _smi()
        ours = src.collect()
    finally:
        src.close()
    assert smi, "nvidia-smi listed no GPU"
    for idx, row in smi.items():
        g = ours.gpu(idx)
        assert g.up
        assert g.uuid == row["uuid"]
        mib = 1024 ** 2
        assert g.memory_total / mib == pytest.approx(row["total"], abs=2)
        assert g.memory_used / mib == pytest.approx(row["used"], abs=max(64, 0.02 * row["total"]))
        if row["power"] is not None:
            assert g.power_watts == pytest.approx(row["power"], rel=0.25, abs=25)
        # utilization moves between the two reads: the same scale and a loose band
        assert 0 <= g.utilization <= 1
        assert g.utilization * 100 == pytest.approx(row["util"], abs=30)
