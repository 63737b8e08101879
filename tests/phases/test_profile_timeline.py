"""`teye profile`'s timeline PNG (issue 38): readable at any step rate, device idle only from GPU samples, the host
CPU on a scale.  The oracle is the rendered PNG itself: the pixels of each phase's colour, counted, against the
phase times the synthetic job was given."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")
import matplotlib.image as mpimg  # noqa: E402
import numpy as np  # noqa: E402

from agent.context import AgentContext  # noqa: E402
from agent.profile import IDLE_COLOR, PHASE_COLORS, phase_bands, plot_timeline, timeline_figure  # noqa: E402

MS = 1_000_000
T0 = 10**12
SHARES = {"data_wait": 0.20, "host": 0.15, "compute": 0.41, "communication": 0.10}   # 14 % untracked


def _job(steps: int, seconds: float, job: str = "job"):
    """``steps`` steps back to back over ``seconds``, each split by SHARES."""
    step = int(seconds * 1e9) // steps
    out = []
    for i in range(steps):
        s = x = T0 + i * step
        for ph, share in SHARES.items():
            d = int(share * step)
            out.append((job, ph, x, x + d))
            x += d
        out.append((job, "step", s, s + step))
    return out


def _pixels(path) -> np.ndarray:
    return (mpimg.imread(str(path))[..., :3] * 255).round().astype(int)


def _count(img: np.ndarray, color: str, tol: int = 0) -> int:
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return int((np.abs(img - rgb).sum(axis=2) <= tol).sum())


def _render(tmp_path, intervals, ctx, seconds=9.0, name="t.png", gpu_note=None):
    path = tmp_path / name
    cpu = [(T0 + k * 250 * MS, 0.5) for k in range(1, int(seconds * 4) + 1)]
    plot_timeline(str(path), T0, T0 + int(seconds * 1e9), intervals, ["job"], ctx, cpu, 0.0, gpu_note=gpu_note, cpus=2)
    return _pixels(path)


def _shares(img) -> dict:
    n = {ph: _count(img, PHASE_COLORS[ph]) for ph in SHARES}
    total = sum(n.values())
    assert total > 20000, n   # two lanes' worth of colour, not a legend's
    return {ph: v / total for ph, v in n.items()}


def _want() -> dict:
    tracked = sum(SHARES.values())
    return {ph: s / tracked for ph, s in SHARES.items()}


@pytest.mark.parametrize("steps,gpu", [(400, False), (400, True), (8000, False)])
def test_a_400_step_9_second_profile_shows_each_phase_in_proportion(tmp_path, steps, gpu):
    # 400 steps: 22.5 ms, about 2.5 pixels each; drawn one by one (antialiased, with step ticks), compute (41 % of
    # step time) covered 0.3 % of the phase colours' pixels.  8,000 steps: a step is a third of a pixel, so
    # drawn one by one the last phase drawn in a pixel takes it whole
    ctx = AgentContext()
    if gpu:
        for k in range(45):
            ctx.timeline.add("0", T0 + k * 200 * MS, T0 + (k + 1) * 200 * MS, 0.0 if k % 5 == 0 else 0.8)
    got = _shares(_render(tmp_path, _job(steps, 9.0), ctx))
    for ph, want in _want().items():
        assert got[ph] == pytest.approx(want, abs=0.02), (ph, got)


def test_slow_steps_are_drawn_as_they_are_and_keep_their_proportions(tmp_path):
    # 20 steps of 450 ms (about 50 pixels each): every interval drawn on its own, the shares still hold
    got = _shares(_render(tmp_path, _job(20, 9.0), AgentContext()))
    for ph, want in _want().items():
        assert got[ph] == pytest.approx(want, abs=0.02), (ph, got)


def test_a_cpu_only_job_has_no_hatched_idle_and_its_gpu_lane_says_so(tmp_path):
    # the job reports no device work for 59 % of every step; without GPU samples none of it is "device idle"
    img = _render(tmp_path, _job(400, 9.0), AgentContext(), gpu_note="gpu collector disabled in the configuration")
    assert _count(img, IDLE_COLOR, tol=60) == 0
    fig = timeline_figure(T0, T0 + 9 * 10**9, _job(400, 9.0), ["job"], AgentContext(), [], 0.0,
                          gpu_note="gpu collector disabled in the configuration")
    try:
        hatched = [c for a in fig.axes for c in a.collections if c.get_hatch()]
        assert hatched == []
        texts = [t.get_text() for a in fig.axes for t in a.texts]
        assert texts == ["no GPU samples (gpu collector disabled in the configuration)"]
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_device_idle_is_hatched_where_the_gpu_samples_are_idle_and_only_there(tmp_path):
    ctx = AgentContext()
    for k in range(45):   # idle 0.0-0.2 s, 1.0-1.2 s, ... (9 gaps of 200 ms), busy 0.8 between
        ctx.timeline.add("0", T0 + k * 200 * MS, T0 + (k + 1) * 200 * MS, 0.0 if k % 5 == 0 else 0.8)
    img = _render(tmp_path, _job(400, 9.0), ctx)
    assert _count(img, IDLE_COLOR, tol=60) > 500
    fig = timeline_figure(T0, T0 + 9 * 10**9, _job(400, 9.0), ["job"], ctx, [], 0.0)
    try:
        (hatched,) = [c for a in fig.axes for c in a.collections if c.get_hatch()]
        xs = sorted((round(p.vertices[:, 0].min(), 3), round(p.vertices[:, 0].max(), 3)) for p in hatched.get_paths())
        assert xs == [(float(k), k + 0.2) for k in range(9)]
        assert [t.get_text() for a in fig.axes for t in a.texts] == []
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_the_host_cpu_has_an_axis_in_per_cent():
    fig = timeline_figure(T0, T0 + 9 * 10**9, _job(20, 9.0), ["job"], AgentContext(),
                          [(T0 + 10**9, 0.25), (T0 + 2 * 10**9, 0.75)], 0.0, cpus=16)
    try:
        cax = fig.axes[1]
        assert cax.get_ylim() == (0.0, 100.0) and "%" in cax.get_ylabel() and "16 CPUs" in cax.get_ylabel()
        (line,) = cax.get_lines()
        assert list(line.get_ydata()) == [25.0, 25.0, 75.0]
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_bands_hold_every_nanosecond_once_and_start_at_steps():
    iv = [(ph, s, e) for _, ph, s, e in _job(400, 9.0)]
    steps = sorted((s, e) for ph, s, e in iv if ph == "step")
    bands = phase_bands(iv, steps, ("compute", "communication", "data_wait"), 80 * MS)
    for ph in ("compute", "communication", "data_wait"):
        assert sum(acc.get(ph, 0) for _, _, acc in bands) == sum(e - s for p, s, e in iv if p == ph)
    starts = {s for s, _ in steps}
    assert all(a in starts for a, _, _ in bands)
    assert all(b - a >= 80 * MS for a, b, _ in bands)
    assert all(b == a2 for (_, b, _), (a2, _, _) in zip(bands, bands[1:]))   # contiguous
    assert len(bands) == 400 // 4   # 22.5 ms steps: four to a band of at least 80 ms


@pytest.mark.parametrize("steps", [400, 8000])
def test_fast_steps_read_as_steady_bands_not_a_block_of_ticks(tmp_path, steps):
    # every step of this job has the same shares, so once steps are narrower than a band each pixel row across a
    # lane keeps one colour from the first band to the last; drawn step by step, a row changes colour a few
    # times per step (about a thousand times across 9 s of 22.5 ms steps)
    img = _render(tmp_path, _job(steps, 9.0), AgentContext())
    rgb = {ph: np.array([int(PHASE_COLORS[ph][i:i + 2], 16) for i in (1, 3, 5)]) for ph in SHARES}
    phase = np.full(img.shape[:2], -1)
    for k, ph in enumerate(SHARES):
        phase[(img == rgb[ph]).all(axis=2)] = k
    rows = [r for r in range(img.shape[0]) if (phase[r] >= 0).sum() > 500]
    assert len(rows) > 25   # both lanes' phase rows
    changes = max(int((np.diff(phase[r][phase[r] >= 0]) != 0).sum()) for r in rows)
    assert changes <= 2, changes


def test_two_processes_of_one_job_share_each_band_and_stay_inside_their_lane(tmp_path):
    # two ranks with the same steps: their phase times add up to twice the band's width; each band's bar is their
    # shares of the sum, never taller than its lane
    iv = _job(400, 9.0) + _job(400, 9.0)
    got = _shares(_render(tmp_path, iv, AgentContext()))
    for ph, want in _want().items():
        assert got[ph] == pytest.approx(want, abs=0.02), (ph, got)
    fig = timeline_figure(T0, T0 + 9 * 10**9, iv, ["job"], AgentContext(), [], 0.0)
    try:
        tops = {}
        for p in fig.axes[0].patches:
            lane = round(p.get_y() + 0.35) if p.get_height() else None
            tops[lane] = max(tops.get(lane, -9.0), p.get_y() + p.get_height())
        assert tops and all(top <= lane + 0.35 + 1e-9 for lane, top in tops.items())
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_an_hour_of_gpu_samples_is_averaged_over_bands(tmp_path):
    # 18,000 samples of 200 ms, busy 0.2 and 0.8 in turn: drawn as bands a few pixels wide whose height is the
    # mean busy (0.5 of the lane), not 18,000 slivers
    from agent.context import UtilTimeline
    ctx = AgentContext(timeline=UtilTimeline(horizon_s=7200, max_samples=20000))
    for k in range(18000):
        ctx.timeline.add("0", T0 + k * 200 * MS, T0 + (k + 1) * 200 * MS, 0.2 if k % 2 else 0.8)
    fig = timeline_figure(T0, T0 + 3600 * 10**9, [], ["job"], ctx, [], 0.0)
    try:
        from matplotlib.collections import PolyCollection
        paths = [p for c in fig.axes[0].collections if isinstance(c, PolyCollection) and not c.get_hatch()
                 for p in c.get_paths()]
        assert 50 < len(paths) < 400
        for p in paths:
            ys = p.vertices[:, 1]
            assert ys.max() - ys.min() == pytest.approx(0.35, abs=0.01)
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_phases_without_steps_are_banded_on_a_grid_and_none_is_lost():
    # a job whose steps never arrived (or a source without them): 3,000 phase intervals, no step to cut bands at
    iv = [(ph, s, e) for _, ph, s, e in _job(600, 9.0) if ph != "step"]
    bands = phase_bands(iv, [], ("data_wait", "host"), 100 * MS)
    for ph in ("data_wait", "host"):
        assert sum(acc.get(ph, 0) for _, _, acc in bands) == sum(e - s for p, s, e in iv if p == ph)
    assert all(b - a >= 100 * MS for a, b, _ in bands) and 80 <= len(bands) <= 90
    assert phase_bands(iv, [], ("eval",), 100 * MS) == []
