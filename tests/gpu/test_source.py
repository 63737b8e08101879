"""The real NVML backend and GPU source driven by the fake pynvml: error classes, versions, GPM, XID,
processes, MIG; checked through the real sampler and Prometheus exposition."""
from __future__ import annotations

import time

import pynvml
import pytest

from agent.errors import SourceUnavailable
from agent.gpu.nvml import NvmlBackend, pcie_link_max_bytes_per_second
from agent.gpu.procinfo import owner, parse_cgroup
from agent.sampler import Sampler
from tests.gpu.conftest import GPU_PROCFS, exposition, make_source, value, values
from tests.gpu.fake_pynvml import Err, FakeGpu, FakeNvml, Timeline

T0 = 1_700_000_000_000_000
BUSY = Timeline([(T0 - 100_000_000, T0 + 1_000_000_000)])


def _fake(n=2, **kw):
    return FakeNvml([FakeGpu(i, timeline=BUSY, ring_start_us=T0 - 50 * 166_667) for i in range(n)], now_us=T0, **kw)


def test_values_in_base_units_through_the_exposition():
    fake = _fake(1)
    src = make_source(fake)
    src.collect()
    fake.advance(1.0)
    v = values(exposition(src))
    g = {"gpu": "0"}
    assert value(v, "teye_collector_up", collector="gpu") == 1
    assert value(v, "teye_gpu_info", gpu="0", uuid=fake.gpus[0].uuid, name="NVIDIA H100 80GB HBM3",
                 pci_bus_id="00000000:18:00.0", driver_version="550.54.15") == 1
    assert value(v, "teye_gpu_up", **g) == 1
    assert value(v, "teye_gpu_utilization_ratio", **g) == pytest.approx(0.87)
    assert value(v, "teye_gpu_memory_utilization_ratio", **g) == pytest.approx(0.35)
    assert value(v, "teye_gpu_memory_used_bytes", **g) == 20 * 1024 ** 3  # v2: excludes reserved memory
    assert value(v, "teye_gpu_memory_total_bytes", **g) == 80 * 1024 ** 3
    assert value(v, "teye_gpu_power_watts", **g) == pytest.approx(312.5)
    assert value(v, "teye_gpu_energy_joules_total", **g) == pytest.approx(123456.789)
    assert value(v, "teye_gpu_temperature_celsius", **g) == 61
    assert value(v, "teye_gpu_sm_clock_hertz", **g) == 1980e6
    assert value(v, "teye_gpu_memory_clock_hertz", **g) == 2619e6
    assert value(v, "teye_gpu_pcie_transmit_bytes_per_second", **g) == 1_000_000 * 1024
    assert value(v, "teye_gpu_pcie_receive_bytes_per_second", **g) == 250_000 * 1024
    # gen 5 x16: 32 GT/s x 128/130 / 8 bits x 16 lanes
    assert value(v, "teye_gpu_pcie_link_max_bytes_per_second", **g) == pytest.approx(32e9 * 128 / 130 / 8 * 16)
    assert value(v, "teye_gpu_clock_event_active", gpu="0", reason="power_cap") == 1
    assert value(v, "teye_gpu_clock_event_active", gpu="0", reason="gpu_idle") == 0
    assert value(v, "teye_gpu_ecc_errors_total", gpu="0", type="corrected") == 3
    assert value(v, "teye_gpu_ecc_errors_total", gpu="0", type="uncorrected") == 0
    assert value(v, "teye_gpu_remapped_rows_total", gpu="0", type="correctable") == 2
    assert value(v, "teye_gpu_remapped_rows_total", gpu="0", type="uncorrectable") == 1
    assert value(v, "teye_gpu_row_remap_pending", **g) == 0
    assert value(v, "teye_gpu_sm_active_ratio", **g) == pytest.approx(0.71)
    assert value(v, "teye_gpu_sm_occupancy_ratio", **g) == pytest.approx(0.42)
    assert value(v, "teye_gpu_tensor_active_ratio", **g) == pytest.approx(0.555)
    assert value(v, "teye_gpu_dram_active_ratio", **g) == pytest.approx(0.30)
    assert value(v, "teye_gpu_fp16_pipe_active_ratio", **g) == pytest.approx(0.12)
    assert value(v, "teye_gpu_fp32_pipe_active_ratio", **g) == pytest.approx(0.08)
    assert value(v, "teye_gpu_fp64_pipe_active_ratio", **g) == pytest.approx(0.005)
    assert value(v, "teye_gpu_nvlink_receive_bytes_per_second", **g) == 1000 * 2 ** 20
    assert value(v, "teye_gpu_nvlink_transmit_bytes_per_second", **g) == 2000 * 2 ** 20
    assert value(v, "teye_gpu_busy_seconds_total", **g) == pytest.approx(5 * 166_667 / 1e6)  # 5 samples in 1 s
    # dcgm-exporter's defaults (issue 40)
    assert value(v, "teye_gpu_memory_free_bytes", **g) == 80 * 1024 ** 3 - 20 * 1024 ** 3 - 512 * 1024 ** 2
    assert value(v, "teye_gpu_memory_reserved_bytes", **g) == 512 * 1024 ** 2
    assert value(v, "teye_gpu_memory_temperature_celsius", **g) == 71
    assert value(v, "teye_gpu_pcie_replays_total", **g) == 4
    assert value(v, "teye_gpu_encoder_utilization_ratio", **g) == pytest.approx(0.12)
    assert value(v, "teye_gpu_decoder_utilization_ratio", **g) == pytest.approx(0.30)
    assert value(v, "teye_gpu_graphics_engine_active_ratio", **g) == pytest.approx(0.80)
    assert value(v, "teye_gpu_idle_gap_seconds_count", **g) == 0
    # pre-Ampere page retirement is NotSupported on this GPU: absent
    assert not any(name.startswith("teye_gpu_retired_pages") for name, _ in v)


def test_pcie_link_rates_after_encoding():
    assert pcie_link_max_bytes_per_second(1, 1) == 250e6  # 2.5 GT/s, 8b/10b
    assert pcie_link_max_bytes_per_second(3, 16) == pytest.approx(8e9 * 128 / 130 / 8 * 16)
    assert pcie_link_max_bytes_per_second(4, 8) == pytest.approx(16e9 * 128 / 130)
    assert pcie_link_max_bytes_per_second(6, 16) == pytest.approx(64e9 * 242 / 256 / 8 * 16)
    assert pcie_link_max_bytes_per_second(9, 16) is None


def test_not_supported_fields_are_absent_not_nan():
    fake = _fake(2)
    g0 = fake.gpus[0]
    g0.not_supported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperatureV",
                        "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples"}
    g0.ecc = None
    g0.remapped = None
    fake.script("nvmlDeviceGetClockInfo", Err(pynvml.NVML_ERROR_NO_PERMISSION), gpu=0)
    src = make_source(fake)
    text = exposition(src)
    assert "NaN" not in text and "nan" not in text
    v = values(text)
    names0 = {name for name, labels in v if ("gpu", "0") in labels}
    for absent in ("teye_gpu_power_watts", "teye_gpu_energy_joules_total", "teye_gpu_temperature_celsius",
                   "teye_gpu_pcie_transmit_bytes_per_second", "teye_gpu_utilization_ratio",
                   "teye_gpu_busy_seconds_total", "teye_gpu_idle_gap_seconds_count", "teye_gpu_ecc_errors_total",
                   "teye_gpu_remapped_rows_total", "teye_gpu_sm_clock_hertz"):
        assert absent not in names0, absent
        assert (absent, (("gpu", "1"),)) in v or any(n == absent and ("gpu", "1") in l for n, l in v), absent
    assert value(v, "teye_gpu_up", gpu="0") == 1  # an unsupported value is not a failure
    assert value(v, "teye_gpu_memory_clock_hertz", gpu="0") == 2619e6  # only the first clock read was refused
    assert value(v, "teye_gpu_memory_used_bytes", gpu="0") == 20 * 1024 ** 3


def test_each_dcgm_default_a_gpu_does_not_support_is_absent_alone():
    """NotSupported (or a driver without the function) for one of issue 40's counters leaves out that series
    only, on that GPU only; the GPU stays up and every other value is exported."""
    new = ("teye_gpu_memory_temperature_celsius", "teye_gpu_pcie_replays_total", "teye_gpu_encoder_utilization_ratio",
           "teye_gpu_decoder_utilization_ratio", "teye_gpu_memory_reserved_bytes")
    fake = _fake(3)
    fake.gpus[0].memory_temperature = None        # the field's own slot answers NotSupported
    fake.gpus[0].not_supported = {"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetEncoderUtilization",
                                  "nvmlDeviceGetDecoderUtilization"}
    fake.script("nvmlDeviceGetFieldValues", Err(pynvml.NVML_ERROR_NOT_SUPPORTED), gpu=1)   # the whole call refused
    fake.missing |= {"nvmlDeviceGetMemoryInfo_v2"}  # an older driver: memory info v1 has no reserved field
    v = values(exposition(make_source(fake)))
    names = {g: {name for name, labels in v if ("gpu", g) in labels} for g in ("0", "1", "2")}
    for name in new:
        assert name not in names["0"], name
    assert "teye_gpu_memory_temperature_celsius" not in names["1"]
    assert {"teye_gpu_pcie_replays_total", "teye_gpu_encoder_utilization_ratio"} <= names["1"]
    assert set(new) - names["2"] == {"teye_gpu_memory_reserved_bytes"}
    assert value(v, "teye_gpu_memory_temperature_celsius", gpu="2") == 71
    for g in ("0", "1", "2"):
        assert value(v, "teye_gpu_up", gpu=g) == 1
        # v1: free is still there (total - used, its used counting the reserved memory)
        assert value(v, "teye_gpu_memory_free_bytes", gpu=g) == 80 * 1024 ** 3 - 20 * 1024 ** 3 - 512 * 1024 ** 2
    assert value(v, "teye_gpu_power_watts", gpu="0") == pytest.approx(312.5)


def test_versioned_functions_are_probed_once_and_fall_back():
    fake = _fake(2)
    old = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetCurrentClocksEventReasons",
           "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2",
           "nvmlDeviceGetPciInfo_v3"}
    fake.missing |= old
    fake.gpus[0].processes = [(1001, 1 << 30)]
    fake.gpus[0].clock_events = 0x1 | 0x40  # idle + HW thermal, through the deprecated throttle API
    src = make_source(fake)
    for _ in range(5):
        reading = src.collect()
        fake.advance(1.0)
    for name in old - {"nvmlDeviceGetMemoryInfo_v2"}:
        assert fake.calls[name] == 1, name  # one probe for the process, not one per GPU or poll
    g = reading.gpu("0")
    assert dict(g.clock_events)["gpu_idle"] and dict(g.clock_events)["hw_thermal"]
    assert not dict(g.clock_events)["power_cap"]
    assert g.temperature_celsius == 61
    assert g.memory_used == 20 * 1024 ** 3 + 512 * 1024 ** 2  # v1 counts reserved memory as used
    assert g.pci_bus_id == "00000000:18:00.0"
    assert [p.pid for p in reading.processes] == [1001]
    b = src.backend
    assert b.chosen_variant("processes") == "nvmlDeviceGetComputeRunningProcesses_v2"
    assert b.chosen_variant("clock_events") == "nvmlDeviceGetCurrentClocksThrottleReasons"
    assert b.chosen_variant("process_utilization") == "nvmlDeviceGetProcessUtilization"


def test_gpu_lost_mid_run_goes_down_alone_and_recovers():
    fake = _fake(2)
    src = make_source(fake, reprobe_seconds=10.0)
    src.collect()
    fake.advance(1.0)
    before = src.collect()
    assert before.gpu("1").up and before.gpu("1").busy_seconds > 0
    fake.gpus[1].lost = True
    fake.advance(1.0)
    text = exposition(src)
    v = values(text)
    assert value(v, "teye_gpu_up", gpu="1") == 0
    assert value(v, "teye_gpu_up", gpu="0") == 1
    assert value(v, "teye_collector_up", collector="gpu") == 1  # the other GPU keeps the source up
    assert value(v, "teye_gpu_power_watts", gpu="0") == pytest.approx(312.5)
    assert ("teye_gpu_power_watts", (("gpu", "1"),)) not in v  # no stale gauges for a lost GPU
    busy1 = value(v, "teye_gpu_busy_seconds_total", gpu="1")  # counters stay
    assert busy1 == pytest.approx(before.gpu("1").busy_seconds)
    assert value(v, "teye_gpu_info", gpu="1", uuid=fake.gpus[1].uuid, name="NVIDIA H100 80GB HBM3",
                 pci_bus_id="00000000:19:00.0", driver_version="550.54.15") == 1
    assert "GPU is lost" in src.devices[1].reason
    calls = fake.calls["nvmlDeviceGetHandleByIndex"]
    fake.gpus[1].lost = False
    fake.advance(5.0)
    assert not src.collect().gpu("1").up  # not re-probed before reprobe_seconds
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == calls
    fake.advance(20.0)  # down 26 s in all: longer than the 16.7 s the ring holds
    after = src.collect()
    assert after.gpu("1").up and after.gpu("0").up
    assert after.gpu("1").power_watts == pytest.approx(312.5)
    # samples produced while it was down were not read in time: counted lost, never as busy time
    g1 = after.gpu("1")
    assert g1.samples_lost > 0
    assert g1.busy_seconds > busy1


def test_unknown_error_marks_only_that_gpu_down():
    fake = _fake(2)
    src = make_source(fake)
    src.collect()
    fake.script("nvmlDeviceGetPowerUsage", Err(pynvml.NVML_ERROR_UNKNOWN), gpu=0)
    r = src.collect()
    assert not r.gpu("0").up and r.gpu("1").up
    assert "Unknown Error" in src.devices[0].reason


@pytest.mark.parametrize("code,words", [(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
                                        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")])
def test_driver_not_loaded_takes_the_collector_down_with_the_reason(code, words):
    fake = _fake(1)
    fake.init_error = code
    src = make_source(fake)
    sampler = Sampler({"gpu": (src, 1.0)}, clock=src.ctx.clock)
    st = sampler.read_once("gpu")
    assert not st.up and words in st.error
    v = values(exposition(src))
    assert value(v, "teye_collector_up", collector="gpu") == 0
    assert not any(name.startswith("teye_gpu_") for name, _ in v)
    # retried only after reprobe_seconds, then it comes up once the driver is there
    fake.init_error = None
    assert not sampler.read_once("gpu").up
    fake.advance(11.0)
    assert sampler.read_once("gpu").up


def test_driver_unloaded_mid_run_takes_the_source_down_and_back():
    fake = _fake(1)
    src = make_source(fake)
    src.collect()
    fake.script("nvmlDeviceGetSamples", Err(pynvml.NVML_ERROR_UNINITIALIZED))
    with pytest.raises(SourceUnavailable, match="Uninitialized"):
        src.collect()
    assert src.backend is None and fake.calls["nvmlShutdown"] == 1
    fake.advance(11.0)
    assert src.collect().gpu("0").up


def test_driver_without_gpm_and_pre_hopper_gpu():
    fake = _fake(2)
    fake.missing |= {"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"}
    src = make_source(fake)
    src.collect()
    fake.advance(1.0)
    v = values(exposition(src))
    assert not any("sm_active" in name or "nvlink" in name for name, _ in v)
    assert value(v, "teye_gpu_power_watts", gpu="1") == pytest.approx(312.5)
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 2  # asked once per GPU, then remembered

    fake2 = _fake(2)
    fake2.gpus[1].gpm = False  # e.g. an A100: the driver has GPM, the GPU does not
    src2 = make_source(fake2)
    src2.collect()
    fake2.advance(1.0)
    r = src2.collect()
    assert dict(r.gpu("0").gpm)["sm_active"] == pytest.approx(0.71)
    assert r.gpu("1").gpm == ()
    assert fake2.calls["nvmlGpmSampleAlloc"] == 2  # two samples for GPU 0 only


def test_gpm_samples_are_at_least_100ms_apart():
    fake = _fake(1)
    src = make_source(fake)
    src.collect()  # first GPM sample
    fake.advance(0.05)
    assert src.collect().gpu("0").gpm == ()  # too soon: no second sample yet
    assert fake.calls["nvmlGpmSampleGet"] == 1
    fake.advance(0.06)
    assert dict(src.collect().gpu("0").gpm)["tensor_active"] == pytest.approx(0.555)
    assert fake.calls["nvmlGpmSampleGet"] == 2


@pytest.mark.measures("a timed assertion: close stops the thread within its bound")
def test_xid_events_are_counted_by_their_own_thread_and_close_stops_it():
    fake = _fake(2)
    src = make_source(fake, events=True, event_timeout_ms=20)
    src.collect()
    fake.emit_xid(1, 79)
    fake.emit_xid(1, 79)
    fake.emit_xid(0, 13)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum(src.xid.counts().values()) < 3:
        time.sleep(0.01)
    v = values(exposition(src))
    assert value(v, "teye_gpu_xid_errors_total", gpu="1", xid="79") == 2
    assert value(v, "teye_gpu_xid_errors_total", gpu="0", xid="13") == 1
    assert ("teye_gpu_xid_errors_total", (("gpu", "0"), ("xid", "79"))) not in v
    thread = src.xid._thread
    t = time.monotonic()
    src.close()
    assert not thread.is_alive() and time.monotonic() - t < 1.0
    assert fake.calls["nvmlEventSetFree"] == 1 and fake.calls["nvmlShutdown"] == 1


def test_processes_map_to_slurm_jobs_and_pods_and_vanish_on_exit():
    fake = _fake(2)
    fake.gpus[0].processes = [(1001, 4 << 30), (1003, None), (1006, 1 << 20)]
    fake.gpus[1].processes = [(1002, 8 << 30), (1004, 1 << 30), (1005, 1 << 30), (999999, 1 << 20)]
    fake.gpus[0].process_util = [(1001, T0 + 200_000, 80), (1001, T0 + 400_000, 60), (1003, T0 + 300_000, 10)]
    src = make_source(fake)
    src.collect()
    fake.advance(1.0)
    v = values(exposition(src))

    def info(gpu, pid, user, job, pod):
        return value(v, "teye_gpu_process_info", gpu=gpu, pid=str(pid), user=user, slurm_job=job, pod_uid=pod)

    assert info("0", 1001, "root", "4242", "") == 1  # cgroup v1 Slurm path
    assert info("1", 1002, "4242", "777", "") == 1  # cgroup v2 Slurm path; uid without passwd entry
    assert info("0", 1003, "root", "", "0b5bcd6f-3c7d-4f0e-9f3c-123456789abc") == 1  # kubepods, cgroupfs
    assert info("1", 1004, "root", "", "6f1b2c3d-4e5f-4a6b-8c7d-0123456789ef") == 1  # kubepods, systemd
    assert info("1", 1005, "root", "", "") == 1
    assert info("0", 1006, "", "", "") == 1  # garbled status: the process is still listed
    assert info("1", 999999, "", "", "") == 1  # exited between NVML and procfs
    # per-process SM utilization: mean of the samples since the last poll; 0 when NVML listed none
    assert value(v, "teye_gpu_process_sm_utilization_ratio", gpu="0", pid="1001") == pytest.approx(0.70)
    assert value(v, "teye_gpu_process_sm_utilization_ratio", gpu="0", pid="1003") == pytest.approx(0.10)
    assert value(v, "teye_gpu_process_sm_utilization_ratio", gpu="0", pid="1006") == 0
    assert value(v, "teye_gpu_process_memory_used_bytes", gpu="0", pid="1001") == 4 << 30
    assert ("teye_gpu_process_memory_used_bytes", (("gpu", "0"), ("pid", "1003"))) not in v  # N/A: absent
    assert src.ctx.gpu_pids[1001] == frozenset({"0"}) and src.ctx.gpu_pids[1004] == frozenset({"1"})

    fake.gpus[0].processes = [(1003, None)]  # 1001 and 1006 exited
    fake.gpus[1].processes = [(1004, 1 << 30), (1003, None)]  # 1003 now spans both GPUs
    fake.advance(1.0)
    v = values(exposition(src))
    pids = sorted({dict(l)["pid"] for n, l in v if n == "teye_gpu_process_info"})
    assert pids == ["1003", "1004"]
    assert src.ctx.gpu_pids == {1003: frozenset({"0", "1"}), 1004: frozenset({"1"})}


def test_process_count_per_gpu_is_capped():
    fake = _fake(1)
    fake.gpus[0].processes = [(pid, 1 << 20) for pid in range(5000, 5100)]
    src = make_source(fake, max_processes=8)
    r = src.collect()
    assert [p.pid for p in r.processes] == list(range(5000, 5008))


def test_cgroup_and_status_parsers():
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n") == ("12", "")
    assert parse_cgroup("1:cpu:/slurm/uid_5/job_3\n") == ("3", "")
    assert parse_cgroup("0::/user.slice/job_x\n") == ("", "")
    assert owner(GPU_PROCFS, 1002).slurm_job == "777"


def test_mig_instances_are_their_own_gpus():
    fake = _fake(2)
    fake.gpus[0].enable_mig([1, 2])
    fake.gpus[0].mig[0].processes = [(1001, 2 << 30)]
    fake.gpus[0].mig[1].gpm_values = {pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0}
    src = make_source(fake)
    src.collect()
    fake.advance(1.0)
    r = src.collect()
    labels = [g.gpu for g in r.gpus]
    assert labels == ["0", "0/1", "0/2", "1"]
    mig = r.gpu("0/1")
    assert mig.uuid == fake.gpus[0].mig[0].uuid and mig.pci_bus_id == "00000000:18:00.0"
    assert mig.memory_total == 10 * 1024 ** 3 and mig.memory_used == 1024 ** 3
    assert mig.utilization is None and mig.busy_seconds is None  # NVML has no ring for MIG instances
    assert dict(r.gpu("0/2").gpm) == {"sm_active": pytest.approx(0.40)}  # nvmlGpmMigSampleGet
    assert [(p.gpu, p.pid) for p in r.processes] == [("0/1", 1001)]
    assert r.gpu("0").power_watts == pytest.approx(312.5)  # the physical GPU keeps its board metrics
    # the parent lost takes its instances down; they come back with it
    fake.gpus[0].lost = True
    fake.advance(1.0)
    r = src.collect()
    assert [g.up for g in r.gpus] == [False, False, False, True]
    fake.gpus[0].lost = False
    fake.advance(11.0)
    r = src.collect()
    assert all(g.up for g in r.gpus)


def test_backend_error_mapping_table():
    b = NvmlBackend(pynvml)
    absent = ("NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND", "NOT_FOUND", "ARGUMENT_VERSION_MISMATCH")
    down = ("GPU_IS_LOST", "UNKNOWN", "RESET_REQUIRED", "TIMEOUT", "IRQ_ISSUE", "NOT_READY", "GPU_NOT_FOUND")
    off = ("UNINITIALIZED", "LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH")
    assert {b.behaviour(getattr(pynvml, "NVML_ERROR_" + n)) for n in absent} == {"absent"}
    assert {b.behaviour(getattr(pynvml, "NVML_ERROR_" + n)) for n in down} == {"gpu_down"}
    assert {b.behaviour(getattr(pynvml, "NVML_ERROR_" + n)) for n in off} == {"source_down"}
    assert b.behaviour(12345) == "gpu_down"  # an error code this build does not know


def test_a_different_board_at_the_same_index_starts_afresh():
    fake = _fake(1)
    src = make_source(fake, reprobe_seconds=1.0)
    src.collect()
    fake.advance(3.0)
    assert src.collect().gpu("0").busy_seconds > 2.0
    fake.gpus[0].lost = True
    fake.advance(1.0)
    src.collect()
    fake.gpus[0].lost = False
    fake.gpus[0].uuid = "GPU-replaced-board"
    fake.advance(1.0)
    g = src.collect().gpu("0")
    assert g.up and g.uuid == "GPU-replaced-board"
    assert g.busy_seconds == 0.0  # a new ring (its first read is a baseline): the counter restarts
    assert fake.calls["nvmlGpmSampleFree"] == 2 and fake.calls["nvmlGpmSampleAlloc"] == 4


def test_gpu_config_keys_are_validated_and_wired():
    from agent import config
    from agent.errors import ConfigError
    from agent.gpu.source import from_config
    with pytest.raises(ConfigError, match="gpu.idle_gap_buckets"):
        config.load(overrides={"gpu": {"idle_gap_buckets": [1.0, 0.5]}})
    with pytest.raises(ConfigError, match="gpu.max_processes"):
        config.load(overrides={"gpu": {"max_processes": 0}})
    for bad in (-1, 7200, "5s", True):
        with pytest.raises(ConfigError, match="gpu.gauge_interval_seconds"):
            config.load(overrides={"gpu": {"gauge_interval_seconds": bad}})
    assert from_config(config.load()).gauge_ns == 5_000_000_000   # the default
    cfg = config.load(overrides={"gpu": {"idle_gap_buckets": [0.2, 2], "busy_threshold": 0.05, "events": False,
                                         "gpm": False, "max_processes": 3, "reprobe_seconds": 2.5}})
    src = from_config(cfg)
    assert (src.buckets, src.busy_threshold, src.events, src.gpm, src.max_processes, src.reprobe_ns) == \
        ((0.2, 2), 0.05, False, False, 3, 2_500_000_000)
    fake = _fake(1)
    fake.gpus[0].timeline = Timeline([(T0 + 1_000_000, T0 + 1_500_000)])  # idle, busy 0.5 s, idle
    src = make_source(fake, idle_gap_buckets=(0.2, 2.0), busy_threshold=0.05)
    src.collect()
    for _ in range(4):
        fake.advance(1.0)
        r = src.collect()
    assert [le for le, _ in r.gpu("0").idle_gaps.buckets] == [0.2, 2.0, float("inf")]
    assert r.gpu("0").idle_gaps.count == 1  # the idle second before the busy half second


def test_gauges_are_read_every_gauge_interval_and_idle_gaps_every_poll():
    """gauge_seconds=5 with a 1 s poll: power, clocks, memory, PCIe ... are read at the first poll and then
    once 5 s have passed (values as of that read), while the utilization samples are read at every poll,
    so no idle gap is lost in between."""
    fake = _fake(1)
    fake.gpus[0].timeline = Timeline([(T0 + 1_000_000, T0 + 1_500_000), (T0 + 2_500_000, T0 + 3_000_000)])
    src = make_source(fake, gauge_seconds=5.0)
    gauge_calls = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetUtilizationRates",
                   "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons")
    src.collect()
    first = {c: fake.calls[c] for c in gauge_calls}
    assert all(first.values()), first
    samples = fake.calls["nvmlDeviceGetSamples"]
    fake.gpus[0].power_mw = 100_000
    for _ in range(4):                      # 1 .. 4 s: gauges kept, samples read
        fake.advance(1.0)
        r = src.collect()
        assert r.gpu("0").power_watts == pytest.approx(312.5)
    assert {c: fake.calls[c] for c in gauge_calls} == first
    assert fake.calls["nvmlDeviceGetSamples"] == samples + 4
    assert r.gpu("0").idle_gaps.count == 2  # the idle seconds before each busy half second, none lost
    fake.advance(1.0)                       # 5 s: read again
    assert src.collect().gpu("0").power_watts == pytest.approx(100.0)
    assert all(fake.calls[c] > first[c] for c in gauge_calls)


def test_what_slows_each_gpu_is_published_for_the_verdicts():
    """ctx.gpu_notes: the clock events that hold a GPU's clocks down (not gpu_idle), its XIDs; cited for the
    critical rank of a data-parallel job (agent/phases/ranks.py)."""
    fake = _fake(2)
    fake.gpus[1].clock_events = 0x1   # gpu_idle only: nothing slows it
    src = make_source(fake)
    src.collect()
    assert src.ctx.gpu_notes == {"0": "clocks held down by power_cap, SM clock 1980 MHz"}
