"""Advice that starts from what the job is configured with (issue 45): agent.phases.advice through the
verdict and the critical rank.  Oracles: the phrases each case must and must not hold, written here (never
read from the code under test), on evidence built by hand (94 % of a step in data_wait, a rank that
computes 50 ms a step against 10 ms)."""
from __future__ import annotations

import pytest

from agent.phases import advice as advice_mod
from agent.phases import ranks
from agent.phases.verdict import (CAUSES, KINDS, Evidence, InputWait, advice, base_advice, base_catalog, decide)

TUNED = (("loader.num_workers", "2"), ("loader.pin_memory", "true"), ("loader.persistent_workers", "true"),
         ("loader.prefetch_factor", "2"), ("loader.batch_size", "64"))
# what issue 45's tuned loop was told: none of it may be said to a loader that has it
LOADER_SUGGESTIONS = ("DataLoader(num_workers=N)", "Set DataLoader num_workers", "pin_memory=True with",
                      "Pin the batches", "persistent_workers=True so", "Keep the workers between epochs",
                      "never num_workers=0")
EXCHANGE_SUGGESTIONS = ("bucket_cap_mb=...", "Larger gradient buckets", "larger gradient buckets (bucket_cap_mb)",
                        "fp16_compress_hook / bf16_compress_hook", "fp16_compress_hook or bf16_compress_hook",
                        "Compress the gradients", "no_sync() during gradient accumulation", "under model.no_sync()",
                        "Exchange once per optimizer step", "(no_sync)", "NCCL backend")
NO_SYNC_SUGGESTIONS = ("no_sync() during gradient accumulation", "under model.no_sync()",
                       "Exchange once per optimizer step", "micro-batches (no_sync)")


def input_bound(config=(), cpus=None, cpu_s=1.9):
    """94 % of 10 s of steps in data_wait; the workers busy ``cpu_s`` CPU s per s of wait (host_cpu)."""
    return Evidence(window_s=10, phase_seconds={"data_wait": 9.4, "compute": 0.6}, step_seconds=10.0, steps=100,
                    input_wait=InputWait(wait_s=9.4, cpu_s=cpu_s * 9.4, read_bytes=0), source="torch",
                    config=config, cpus=cpus)


def test_the_tuned_loop_is_never_told_to_set_what_it_has_and_at_the_cores_hears_the_host_is_the_limit():
    v = decide(input_bound(TUNED, cpus=2))
    assert (v.kind, v.cause) == ("input", "host_cpu")
    assert not [p for p in LOADER_SUGGESTIONS if p in v.recommendation], v.recommendation
    assert v.recommendation.startswith("The job already has DataLoader(num_workers=2, pin_memory=True, "
                                       "persistent_workers=True, prefetch_factor=2, batch_size=64). ")
    assert "the host is the limit, and more workers will not help" in v.recommendation
    assert "Move the decoding offline" in v.recommendation and "decode_jpeg(device='cuda')" in v.recommendation
    assert "Raise DataLoader num_workers" not in v.recommendation
    assert v.tips == ("torch.loader.host_limit", "torch.input.cpu_work")
    # without the configuration the same evidence gets the paragraph that repeats it (the oracle's phrases
    # are the ones issue 45 reported: this test can fail)
    plain = decide(input_bound())
    assert [p for p in LOADER_SUGGESTIONS if p in plain.recommendation]


def test_workers_below_the_cores_are_raised_and_storage_gets_prefetch_not_more_cpu():
    v = decide(input_bound(TUNED, cpus=16))
    assert "Raise DataLoader num_workers while the node has free cores" in v.recommendation
    assert "the host is the limit" not in v.recommendation
    assert not [p for p in LOADER_SUGGESTIONS if p in v.recommendation]
    a = advice("input", "storage", "torch", TUNED, cpus=2)
    assert a.tips == ("torch.loader.more_io_workers", "torch.loader.prefetch", "torch.input.storage")
    a = advice("input", "storage", "torch", TUNED + (("loader.prefetch_factor", "8"),), cpus=2)
    assert "torch.loader.prefetch" not in a.tips   # (the later value wins in the mapping: 8)


def test_a_loader_without_workers_or_pinning_is_told_so_and_not_about_persistence():
    cfg = (("loader.num_workers", "0"), ("loader.pin_memory", "false"), ("loader.persistent_workers", "false"))
    a = advice("input", "host_cpu", "torch", cfg, cpus=2)
    assert a.tips == ("torch.loader.set_workers", "torch.loader.pin_memory", "torch.input.cpu_work")
    assert "Set DataLoader num_workers above 0" in a.text and "Keep the workers between epochs" not in a.text
    cfg = (("loader.num_workers", "4"), ("loader.pin_memory", "true"), ("loader.persistent_workers", "false"))
    assert advice("input", "unknown", "torch", cfg, cpus=32).tips == (
        "torch.loader.more_workers", "torch.loader.persistent", "torch.input.slow_items")


def rank_ev(compute_ms, comm_ms, config=()):
    n = 100
    step = (compute_ms + comm_ms + 1) / 1000
    return Evidence(window_s=10, phase_seconds={"compute": n * compute_ms / 1000, "communication": n * comm_ms / 1000,
                                                "data_wait": n / 1000},
                    step_seconds=n * step, steps=n, source="torch", config=config, cpus=8)


USES_NO_SYNC = (("ddp.bucket_cap_bytes", str(25 * 2**20)), ("ddp.comm_hook", "fp16_compress_hook"),
                ("ddp.no_sync", "true"))


@pytest.mark.parametrize("slow,kind", [((50, 5), "compute"), ((35, 15), "communication")])
def test_the_rank_that_computes_longer_gets_advice_about_itself_never_the_exchange(slow, kind):
    """Rank 1 computes 50 ms (35 ms) a step; rank 0 computes 10 ms and waits for it in the exchange.  Its own
    verdict is compute (communication: 30 % of its step, cause straggler): either way, advice about rank 1."""
    evs = [ranks.RankEvidence(0, 100, ("0",), rank_ev(10, 45, USES_NO_SYNC)),
           ranks.RankEvidence(1, 101, ("1",), rank_ev(*slow, USES_NO_SYNC), "clocks held down: power cap")]
    crit = ranks.judge(evs)
    assert crit.rank.rank == 1 and crit.named and crit.verdict.kind == kind
    text = crit.verdict.recommendation
    assert not [p for p in EXCHANGE_SUGGESTIONS if p in text], text
    assert text.startswith(f"Rank 1 is the one: it computes {slow[0]} ms per step against 10 ms for the others; "
                           f"its clocks held down: power cap. ")
    for phrase in ("its node:", "its data shard:", "its GPU's clocks:", "the exchange is not what to change"):
        assert phrase in text
    assert crit.verdict.tips == ("rank.slow", "rank.node", "rank.shard", "rank.clocks")


def test_no_sync_and_compression_are_never_suggested_to_a_job_that_has_them_even_when_the_link_is_full():
    a = advice("communication", "network_bandwidth", "torch", USES_NO_SYNC + (("ddp.static_graph", "false"),))
    assert not [p for p in NO_SYNC_SUGGESTIONS + ("Compress the gradients",) if p in a.text], a.text
    assert a.tips == ("comm.link_full", "torch.ddp.buckets", "torch.ddp.static_graph", "torch.ddp.interconnect")
    assert a.text.startswith("The job already has DistributedDataParallel(bucket_cap_mb=25, static_graph=False) "
                             "with fp16_compress_hook, no_sync() accumulation. The link between the nodes is full")
    big = advice("communication", "unknown", "torch", (("ddp.bucket_cap_bytes", str(100 * 2**20)),
                                                       ("ddp.comm_hook", "custom")))
    assert big.tips == ("torch.ddp.compress", "torch.ddp.no_sync", "torch.ddp.interconnect")
    # without a configuration: the framework's paragraph, which suggests no_sync (the phrase is real)
    assert [p for p in NO_SYNC_SUGGESTIONS if p in advice("communication", "network_bandwidth", "torch").text]


def test_autocast_and_compile_are_not_suggested_to_a_job_that_uses_them():
    a = advice("compute", None, "torch", (("autocast.dtype", "bfloat16"), ("torch.compile", "true")))
    assert a.tips == ("torch.compute.tf32", "torch.compute.batch")
    assert "automatic mixed precision" not in a.text.lower() and "torch.compile" in a.text   # (in "already has")
    assert a.text.startswith("The job already has torch.autocast in bfloat16, torch.compile. ")
    assert advice("compute", None, "torch", (("autocast.dtype", "float32"),)).tips[0] == "torch.compute.amp"
    assert advice("host", None, "torch", (("torch.compile", "true"),)).tips == ("torch.host.graphs", "torch.host.rest")


def test_without_a_configuration_every_verdict_keeps_its_frameworks_paragraph():
    for source in ("torch", "tf.data", "client"):
        for kind in KINDS:
            for cause in (CAUSES if kind == "input" else (None,)):
                a = advice(kind, cause, source)
                assert (a.tips, a.text) == ((base_advice(kind, cause, source)[0],), base_advice(kind, cause, source)[1])


def test_every_tip_an_advice_gives_is_in_the_catalog_the_dashboard_maps():
    ids = {i for i, _ in advice_mod.catalog(base_catalog())}
    assert len(ids) == len(advice_mod.catalog(base_catalog()))
    configs = [(), TUNED, USES_NO_SYNC, (("loader.num_workers", "0"), ("loader.pin_memory", "false")),
               (("loader.num_workers", "3"), ("loader.pin_memory", "false"), ("loader.persistent_workers", "false"),
                ("ddp.static_graph", "false"), ("ddp.bucket_cap_bytes", "1024")),
               (("autocast.dtype", "float16"), ("torch.compile", "false"))]
    seen = 0
    for source in ("torch", "tf.data", "client", "torch-steps", "keras"):
        for kind in KINDS + ("steps_only_idle",):
            for cause in {"input": CAUSES, "communication": ranks_causes()}.get(kind, (None,)):
                for cfg in configs:
                    for rank in (None, advice_mod.RankFacts(3)):
                        tips = advice(kind, cause, source, cfg, 4, rank).tips
                        assert tips and set(tips) <= ids, (kind, cause, source, cfg, tips)
                        assert len(tips) <= 6   # docs/operations.md's series budget
                        seen += 1
    assert seen > 500


def ranks_causes():
    from agent.phases.links import COMMUNICATION_CAUSES
    return COMMUNICATION_CAUSES


def test_own_data_work_is_never_told_to_tune_the_dataloader_it_does_not_wait_for():
    """A generator of the job's own around a DataLoader (source torch-forward): the input is the loop's own work
    outside the loader, so the advice is to move it into workers or onto the GPU, whatever the loader is set to."""
    from agent.phases.verdict import OWN_DATA_WORK, advice
    cfg = (("loader.num_workers", "0"), ("loader.pin_memory", "False"), ("loader.persistent_workers", "False"))
    for cause in ("host_cpu", "storage", None):
        a = advice("input", cause, "torch-forward", cfg, cpus=8)
        assert a.text == OWN_DATA_WORK and a.tips == ("torch:input:own_data_work",), a
    # the same job reading the DataLoader itself (source torch) gets the loader's own tips
    assert "num_workers above 0" in advice("input", "host_cpu", "torch", cfg, cpus=8).text
