"""docs/metrics.md is generated from the metric declarations and must not go stale."""
import os

from agent.catalog import render
from agent.metrics import registered
from tests.procs import REPO


def test_catalog_is_up_to_date():
    path = os.path.join(REPO, "docs", "metrics.md")
    with open(path, encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == render(), "docs/metrics.md is stale: run `python -m agent catalog > docs/metrics.md`"


def test_catalog_lists_every_declared_family_with_its_file():
    text = render()
    for name, spec in registered().items():
        if spec.source_file.startswith("tests/"):
            continue
        assert f"| `{name}` | {spec.kind} |" in text
        assert os.path.exists(os.path.join(REPO, spec.source_file)), spec.source_file


def test_contract_names_from_the_host_issue_are_declared():
    render()
    contract = """teye_cpu_seconds_total teye_memory_total_bytes teye_memory_available_bytes teye_memory_used_bytes
    teye_memory_cached_bytes teye_memory_buffers_bytes teye_disk_read_bytes_total teye_disk_written_bytes_total
    teye_network_receive_bytes_total teye_network_transmit_bytes_total teye_network_receive_packets_total
    teye_network_transmit_packets_total teye_infiniband_receive_bytes_total teye_infiniband_transmit_bytes_total
    teye_infiniband_receive_packets_total teye_infiniband_transmit_packets_total
    teye_infiniband_link_rate_bytes_per_second teye_nfs_client_read_bytes_total teye_nfs_client_write_bytes_total
    teye_nfsd_read_bytes_total teye_nfsd_write_bytes_total teye_collector_up teye_collector_duration_seconds""".split()
    missing = [n for n in contract if n not in registered()]
    assert not missing


def test_every_dcgm_exporter_field_maps_to_a_declared_family():
    """docs/metrics.md's dcgm-exporter table (issue 40) names only families teye declares, each once, with
    the units and kinds of teye's conventions; the fields issue 40 asks for are all carried."""
    from agent.gpu.source import DCGM_FIELDS
    render()
    reg = registered()
    carried = {}
    for field, family, _ in DCGM_FIELDS:
        for f in filter(None, (x.strip() for x in family.split(","))):
            assert f in reg, (field, f)
            assert f.startswith("teye_gpu_") and (reg[f].kind != "counter") == (not f.endswith("_total")), f
            carried[f] = field
    for field in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ENC_UTIL",
                  "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED",
                  "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        assert field in carried.values(), field
