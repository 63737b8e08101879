"""Clock synchronisation: this kernel's adjtimex read through ctypes against a C program using glibc's own
<sys/timex.h> (an independent struct layout), and scripted kernel states at the syscall's one door."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from agent.sampler import Sampler
from agent.sources import timex
from agent.sources.timex import STA_NANO, STA_UNSYNC, TimexSource
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition

C_PROGRAM = r"""
#include <stdio.h>
#include <sys/timex.h>
int main(void) {
    struct timex tx = {0};
    int state = adjtimex(&tx);
    printf("%d %ld %ld %ld %ld %d %d\n", state, tx.offset, tx.freq, tx.maxerror, tx.esterror, tx.status, tx.tai);
    return state < 0;
}
"""


def _exposition(src):
    s = Sampler({"timex": (src, 15.0)})
    st = s.read_once("timex")
    assert st.up, st.error
    return parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())


def test_the_kernels_state_equals_glibcs_struct(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "./dev.sh test installs gcc"
    (tmp_path / "t.c").write_text(C_PROGRAM)
    subprocess.run([cc, "-O0", "-o", str(tmp_path / "t"), str(tmp_path / "t.c")], check=True)
    # maxerror grows by the kernel's tolerance every second while nothing disciplines the clock: read both
    # within the same second and allow that drift (500 µs/s) on it alone
    c = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    state, fields = timex.read_adjtimex()
    assert state == int(c[0])
    assert (fields["offset"], fields["freq"], fields["status"], fields["tai"]) == \
        (int(c[1]), int(c[2]), int(c[5]), int(c[6]))
    assert abs(fields["maxerror"] - int(c[3])) <= 1000 and fields["esterror"] == int(c[4])
    out = _exposition(TimexSource())
    assert out[("teye_timex_sync_status", ())] == (0 if int(c[5]) & STA_UNSYNC else 1)
    assert out[("teye_timex_status", ())] == int(c[5])


@pytest.mark.parametrize("status,offset,expect_offset", [
    (0x0001, 1500, 0.0015),                  # STA_PLL, synced, offset in microseconds
    (0x0001 | STA_NANO, 1500, 0.0000015),    # STA_NANO: nanoseconds
    (STA_UNSYNC, -250000, -0.25),            # unsynchronised, the clock behind
])
def test_scripted_kernel_states(status, offset, expect_offset):
    fields = {"offset": offset, "freq": 65536 * 12, "maxerror": 16_000_000, "esterror": 2500, "status": status,
              "tai": 37}
    out = _exposition(TimexSource(adjtimex=lambda: (0, fields)))
    assert out[("teye_timex_sync_status", ())] == (0 if status & STA_UNSYNC else 1)
    assert out[("teye_timex_offset_seconds", ())] == pytest.approx(expect_offset, rel=1e-12)
    assert out[("teye_timex_frequency_adjustment_ratio", ())] == pytest.approx(12e-6, rel=1e-12)  # 12 ppm
    assert out[("teye_timex_maxerror_seconds", ())] == 16.0
    assert out[("teye_timex_estimated_error_seconds", ())] == 0.0025
    assert out[("teye_timex_tai_offset_seconds", ())] == 37


def test_a_refused_syscall_marks_the_collector_down_with_the_reason():
    def refused():
        raise PermissionError(1, "Operation not permitted")

    s = Sampler({"timex": (TimexSource(adjtimex=refused), 15.0)})
    st = s.read_once("timex")
    assert not st.up and "adjtimex(2) failed" in st.error and "not permitted" in st.error
