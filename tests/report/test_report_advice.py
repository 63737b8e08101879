"""`teye report`'s advice starts from what the job is configured with (issue 45): teye_job_config_info read
back from Prometheus, the critical rank that computes longer.  Hand-made series as in test_straggler_units
(the same job "dp": rank 2 computes 1.8 s a step, the others wait for it); the oracle: the phrases the
report's verdict note must and must not hold (tests/phases/test_advice.py)."""
from __future__ import annotations

from tests.phases.test_advice import EXCHANGE_SUGGESTIONS, LOADER_SUGGESTIONS
from tests.report.test_straggler_units import compute_straggler_job, fetched, report


def with_config(f, config, inst_from=0.0):
    for inst in ("n-a", "n-b"):
        for k, v in config.items():
            f.verdict[("teye_job_config_info", inst, "dp", f"{k}={v}")] = [(t, 1.0) for t in f.grid if t >= inst_from]
        f.jinfo_source[(inst, "dp")] = (f.grid[-1], "torch")
    f.verdict_by.clear()
    f.index()
    return f


def verdict_note(text):
    """The report's verdict note, its wrapped lines joined."""
    flat = " ".join(text.split())
    start = flat.index("Verdict ")
    return flat[start:]


def test_the_compute_slow_rank_of_a_job_using_no_sync_is_told_about_that_rank():
    cfg = {"ddp.no_sync": "true", "ddp.comm_hook": "fp16_compress_hook", "loader.num_workers": "4"}
    f = with_config(fetched(compute_straggler_job(), verdicts={"n-a": "communication", "n-b": "communication"}),
                    cfg)
    job, text, md = report(f)
    assert job["config"] == dict(sorted(cfg.items()))
    for out in (text, md):
        note = verdict_note(out)
        assert not [p for p in EXCHANGE_SUGGESTIONS if p in note], note
        assert "Rank 2 is the one" in note and "its data shard:" in note and "its GPU's clocks:" in note


def test_without_the_configuration_the_report_keeps_its_paragraph():
    f = fetched({0: {"compute": 0.5, "data_wait": 0.45}}, verdicts={"n-a": "input"})
    f.jinfo_source[("n-a", "dp")] = (100.0, "torch")
    job, text, _ = report(f)
    assert job["config"] == {} and [p for p in LOADER_SUGGESTIONS if p in verdict_note(text)]
    cfg = {"loader.num_workers": "2", "loader.pin_memory": "true", "loader.persistent_workers": "true"}
    job, text, _ = report(with_config(fetched({0: {"compute": 0.5, "data_wait": 0.45}}, verdicts={"n-a": "input"}),
                                      cfg))
    note = verdict_note(text)
    assert not [p for p in LOADER_SUGGESTIONS if p in note], note
    assert "The job already has DataLoader(num_workers=2, pin_memory=True, persistent_workers=True)" in note
