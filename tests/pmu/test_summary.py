"""`teye profile`'s hardware-counter figures and how the verdict cites them (pure functions)."""
from agent.pmu.source import PmuReading
from agent.pmu.summary import HOST_INPUT_RECOMMENDATION, refine_verdict, render, summarize
from agent.profile import render_overview

BEFORE = PmuReading(cycles=(("0", 1e9), ("1", 1e9)), instructions=(("0", 1e9), ("1", 1e9)),
                    flops=(("0", "double", "scalar", 0.0), ("0", "double", "256", 0.0), ("1", "single", "512", 0.0)),
                    memory_read=(("0", 0.0),), memory_written=(("0", 0.0),),
                    pcie_written=(("0", "0000:17", 0.0),))
AFTER = PmuReading(cycles=(("0", 5e9), ("1", 3e9)), instructions=(("0", 3e9), ("1", 3e9)),
                   flops=(("0", "double", "scalar", 2e9), ("0", "double", "256", 4e9), ("1", "single", "512", 2e9)),
                   memory_read=(("0", 40e9),), memory_written=(("0", 8e9),),
                   pcie_written=(("0", "0000:17", 6e9),))


def test_rates_over_the_interval():
    s = summarize(BEFORE, AFTER, 2.0)
    assert s["cpi"] == 1.5                                  # 6e9 cycles / 4e9 instructions
    assert s["gflops"] == 4.0 and s["gflops_by_class"] == {"double/256": 2.0, "double/scalar": 1.0,
                                                             "single/512": 1.0}
    assert s["vectorization_ratio"] == 0.75                  # packed 6e9 of 8e9 operations
    assert (s["memory_read_gbps"], s["memory_written_gbps"]) == (20.0, 4.0)
    assert s["pcie_read_gbps"] is None and s["pcie_written_gbps"] == 3.0   # ICX: no host-to-device counter
    assert render(s) == ("CPI 1.50, 4.00 GFLOP/s, vectorization 75 %, memory 20.00 GB/s read, 4.00 GB/s written, "
                         "PCIe n/a GB/s host-to-device, 3.00 GB/s device-to-host")


def test_amd_flops_give_no_vectorization_ratio():
    b = PmuReading(flops=(("0", "all", "all", 0.0),))
    a = PmuReading(flops=(("0", "all", "all", 3e9),))
    s = summarize(b, a, 1.0)
    assert s["gflops"] == 3.0 and s["vectorization_ratio"] is None and s["cpi"] is None


def test_input_bound_job_on_a_saturated_host_is_host():
    s = summarize(BEFORE, AFTER, 2.0)
    v = {"kind": "input", "evidence": "data_wait holds 60 % of step time", "recommendation": "prefetch"}
    busy = refine_verdict(v, s, cpu_busy_ratio=0.95)
    assert busy["kind"] == "host" and busy["recommendation"] == HOST_INPUT_RECOMMENDATION
    assert "host CPUs 95 % busy" in busy["evidence"] and "CPI 1.50" in busy["evidence"]
    mem = refine_verdict(v, s, cpu_busy_ratio=0.3, memory_peak_bytes_per_second=25e9)   # 24 GB/s of 25
    assert mem["kind"] == "host" and "memory bandwidth 24.0 GB/s, 96 % of the configured peak" in mem["evidence"]
    calm = refine_verdict(v, s, cpu_busy_ratio=0.3, memory_peak_bytes_per_second=100e9)
    assert calm["kind"] == "input" and calm["recommendation"] == "prefetch"
    assert calm["evidence"] == "data_wait holds 60 % of step time; host counters: " + render(s)
    # without counters (VM): the verdict stays as the phases say, whatever the CPU load
    assert refine_verdict(v, None, cpu_busy_ratio=0.99) == v


def test_overview_prints_the_counters_or_why_not():
    base = {"command": ["train"], "exit_status": 0, "duration_s": 2.0, "output_dir": "d", "gpu_note": "none",
            "gpus": [], "jobs": [], "timeline_png": None, "timeline_note": "x"}
    text = render_overview(dict(base, host={"cpus": 2, "cpu_busy_ratio": 0.5,
                                            "counters": summarize(BEFORE, AFTER, 2.0)}))
    assert "  host counters: CPI 1.50, 4.00 GFLOP/s, vectorization 75 %" in text
    text = render_overview(dict(base, host={"cpus": 2, "cpu_busy_ratio": 0.5, "counters": None,
                                            "counters_note": "no hardware PMU: ..."}))
    assert "  host counters: not available (no hardware PMU: ...)" in text


def test_amd_zen3_memory_is_read_and_written_together():
    b = PmuReading(memory_transferred=(("0", 0.0), ("1", 1e9)))
    a = PmuReading(memory_transferred=(("0", 30e9), ("1", 11e9)))
    s = summarize(b, a, 2.0)
    assert s["memory_transferred_gbps"] == 20.0 and s["memory_read_gbps"] is None and s["memory_written_gbps"] is None
    assert render(s) == "memory 20.00 GB/s read and written together"
    v = {"kind": "input", "evidence": "data_wait holds 60 % of step time", "recommendation": "prefetch"}
    mem = refine_verdict(v, s, cpu_busy_ratio=0.3, memory_peak_bytes_per_second=22e9)
    assert mem["kind"] == "host" and "memory bandwidth 20.0 GB/s, 91 % of the configured peak" in mem["evidence"]
