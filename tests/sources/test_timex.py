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
    printf("%d %ld %ld %ld %ld %d %d %ld %ld %ld %ld %d %ld %ld %ld %ld %ld\n", state, tx.offset, tx.freq,
           tx.maxerror, tx.esterror, tx.status, tx.tai, tx.constant, tx.tick, tx.ppsfreq, tx.jitter, tx.shift,
           tx.stabil, tx.jitcnt, tx.calcnt, tx.errcnt, tx.stbcnt);
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
    # the loop, tick and PPS fields after them in glibc's struct (issue 49): the layout holds to its end
    more = ("constant", "tick", "ppsfreq", "jitter", "shift", "stabil", "jitcnt", "calcnt", "errcnt", "stbcnt")
    assert tuple(fields[k] for k in more) == tuple(int(x) for x in c[7:17])
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


def test_loop_tick_and_pps_fields_in_node_exporters_units():
    """Scripted values: node_exporter's conversions (tick in microseconds; ppsfreq and stabil in 2^-16 ppm; jitter
    in microseconds, or nanoseconds with STA_NANO; shift, counts and the loop constant as they are)."""
    fields = {"offset": 0, "freq": 0, "maxerror": 0, "esterror": 0, "status": STA_NANO, "tai": 0,
              "constant": 6, "tick": 10000, "ppsfreq": 65536 * 3, "jitter": 2500, "shift": 4, "stabil": 65536 // 2,
              "jitcnt": 7, "calcnt": 11, "errcnt": 13, "stbcnt": 17}
    out = _exposition(TimexSource(adjtimex=lambda: (0, fields), sysfs="/nonexistent"))
    assert out[("teye_timex_loop_time_constant", ())] == 6
    assert out[("teye_timex_tick_seconds", ())] == 0.01
    assert out[("teye_timex_pps_frequency_hertz", ())] == pytest.approx(3e-6, rel=1e-12)
    assert out[("teye_timex_pps_jitter_seconds", ())] == pytest.approx(2.5e-6, rel=1e-12)   # nanoseconds
    assert out[("teye_timex_pps_shift_seconds", ())] == 4
    assert out[("teye_timex_pps_stability_hertz", ())] == pytest.approx(0.5e-6, rel=1e-12)
    assert [out[(f"teye_timex_pps_{n}_total", ())] for n in ("jitter", "calibration", "error", "stability_exceeded")] \
        == [7, 11, 13, 17]
    assert not [n for n, _ in out if n.startswith("teye_time_clocksource")]   # no such sysfs: absent


def test_clock_sources_and_zone_against_this_machine():
    """sysfs's own files read by the shell, and the C library's zone (date +%z) as the oracles."""
    out = _exposition(TimexSource())
    base = "/sys/devices/system/clocksource/clocksource0"
    with open(f"{base}/current_clocksource") as fh:
        current = fh.read().strip()
    with open(f"{base}/available_clocksource") as fh:
        available = set(fh.read().split())
    assert {dict(l)["clocksource"] for (n, l) in out if n == "teye_time_clocksource_available_info"} == available
    assert [dict(l)["clocksource"] for (n, l) in out if n == "teye_time_clocksource_current_info"] == [current]
    z = subprocess.run(["date", "+%z %Z"], capture_output=True, text=True, check=True).stdout.split()
    offset = (1 if z[0][0] == "+" else -1) * (int(z[0][1:3]) * 3600 + int(z[0][3:5]) * 60)
    assert out[("teye_time_zone_offset_seconds", (("time_zone", z[1]),))] == offset


def test_garbled_clock_sources_leave_only_them_out(tmp_path):
    d = tmp_path / "devices" / "system" / "clocksource" / "clocksource0"
    d.mkdir(parents=True)
    (d / "available_clocksource").write_text("tsc hpet\n")
    (d / "current_clocksource").write_text("tsc hpet\n")   # two current sources: not what the kernel writes
    fields = {"offset": 0, "freq": 0, "maxerror": 0, "esterror": 0, "status": 0, "tai": 0}
    out = _exposition(TimexSource(adjtimex=lambda: (0, fields), sysfs=str(tmp_path)))
    assert not [n for n, _ in out if n.startswith("teye_time_clocksource")]
    assert out[("teye_timex_sync_status", ())] == 1
