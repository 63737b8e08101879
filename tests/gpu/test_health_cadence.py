"""ECC, retired-page and remapped-row counters are read every 10 s and at (re)attach, not every poll."""
from __future__ import annotations

from agent.gpu.source import HEALTH_EVERY_NS
from tests.gpu.conftest import make_source
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline

T0 = 1_700_000_000_000_000


def test_health_counters_follow_their_own_cadence():
    fake = FakeNvml([FakeGpu(0, timeline=Timeline([(T0 - 10**8, T0 + 10**9)]), ring_start_us=T0 - 50 * 166_667)],
                    now_us=T0)
    src = make_source(fake)
    ecc0 = fake.calls["nvmlDeviceGetTotalEccErrors"]
    r = src.collect()
    reads = fake.calls["nvmlDeviceGetTotalEccErrors"] - ecc0
    assert reads > 0 and dict(r.gpu("0").ecc)["corrected"] == 3
    fake.gpus[0].ecc = (7, 1)
    fake.gpus[0].remapped = (4, 1, 0, 0)
    polls = HEALTH_EVERY_NS // 10**9
    for _ in range(polls - 1):  # 1 s polls: the counters are not read again within 10 s
        fake.advance(1.0)
        r = src.collect()
        assert dict(r.gpu("0").ecc)["corrected"] == 3 and r.gpu("0").remapped_rows[0] == 2
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] - ecc0 == reads
    fake.advance(1.0)
    r = src.collect()  # 10 s after the first read
    assert dict(r.gpu("0").ecc) == {"corrected": 7, "uncorrected": 1} and r.gpu("0").remapped_rows[0] == 4
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] - ecc0 == 2 * reads
    assert r.gpu("0").utilization is not None and fake.calls["nvmlDeviceGetUtilizationRates"] == polls + 1
