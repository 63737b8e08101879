"""The TensorFlow profiler as an oracle: read its input-pipeline analyzer headless.

``python -m workloads.train ... --profile-dir DIR`` traces the steps after the warm-up with
``tf.profiler.experimental.start/stop`` (each step inside a ``Trace("train", step_num=i)``);
:func:`input_analysis` turns the ``.xplane.pb`` it writes into the analyzer's JSON with
``xprof``'s converter (``pip install xprof``, the ``dev`` extra) and returns what the
profiler's overview tells its user: how input-bound the program is, the percentage it
bases that on, and the sentence itself.

The analyzer's classes (its own words): ``HIGHLY`` input-bound (a large share of step time
waiting for a tf.data input), ``MODERATELY``, ``NOT``, ``COULD be`` and ``POTENTIALLY``
(much of the step is "All Others" time, "which could be due to I/O or Python execution or
both": a Python generator's input wait is seen only as such).  The class alone is no
verdict: the analyzer says POTENTIALLY even for 4 % of All Others time.
:func:`says_input_bound` therefore judges the percentage the conclusion gives by teye's
own threshold (``phases.input_bound_threshold``, 20 %, the analyzer's HIGHLY bound too).
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, Optional

__all__ = ["input_analysis", "parse_conclusion", "says_input_bound", "ProfilerUnavailable", "profile_callback"]

_CONCLUSION = re.compile(r"Your program (?:is )?(HIGHLY|MODERATELY|NOT|COULD|POTENTIALLY)(?: be)? input-bound "
                         r"because (?:only )?([0-9.]+)\s*%")


class ProfilerUnavailable(RuntimeError):
    """xprof is missing, or the profile holds no analyzable step (the message says which)."""


def parse_conclusion(text: str) -> Dict[str, Any]:
    """The analyzer's input conclusion -> {"class": HIGHLY|..., "percent": float, "text": ...}."""
    m = _CONCLUSION.search(text or "")
    if not m:
        raise ProfilerUnavailable(f"unrecognized input conclusion: {text!r}")
    return {"class": m.group(1), "percent": float(m.group(2)), "text": text}


def says_input_bound(analysis: Dict[str, Any], threshold: float = 0.2) -> bool:
    """Whether the profiler's conclusion amounts to teye's ``input`` verdict: it does not say NOT,
    and the share of step time it blames on input (or All Others) reaches ``threshold``."""
    return analysis["class"] != "NOT" and analysis["percent"] >= 100 * threshold


def _xplanes(logdir: str):
    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        raise ProfilerUnavailable(f"no .xplane.pb under {logdir} (did the profiler run?)")
    run = os.path.dirname(paths[-1])             # the newest run's hosts
    return [p for p in paths if os.path.dirname(p) == run]


def input_analysis(logdir: str) -> Dict[str, Any]:
    """Run the input-pipeline analyzer on the newest profile under ``logdir``.

    Returns the parsed conclusion plus the analyzer's mean step time and its mean
    "All others" and "Input" times per step (ms).
    """
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as e:
        raise ProfilerUnavailable(f"xprof is not installed ({e}); pip install xprof") from None
    data, _ = raw_to_tool_data.xspace_to_tool_data(_xplanes(logdir), "input_pipeline_analyzer", {})
    if not data:
        raise ProfilerUnavailable(f"the input-pipeline analyzer returned nothing for {logdir}")
    tables = json.loads(data)
    props: Optional[Dict[str, str]] = next((t["p"] for t in tables if isinstance(t, dict)
                                            and "input_conclusion" in t.get("p", {})), None)
    if props is None:
        raise ProfilerUnavailable("no input_conclusion in the analyzer's output")
    out = parse_conclusion(props["input_conclusion"])

    def num(key: str) -> Optional[float]:
        try:
            return float(props[key])
        except (KeyError, ValueError):
            return None

    out.update(step_ms=num("steptime_ms_average"), all_others_ms=num("other_time_ms_avg"),
               input_ms=num("infeed_time_ms_avg"), hardware=props.get("hardware_type"))
    return out


def profile_callback(logdir: str, first: int, last: int):
    """A Keras callback that traces Model.fit's batches first..last (0-based, of the first epoch) with the
    TensorFlow profiler into ``logdir``, each batch inside a ``Trace("train", step_num=batch)`` from its
    batch-begin to its batch-end callback, as the reference loop traces its steps: what
    :func:`input_analysis` reads."""
    import keras
    import tensorflow as tf

    class ProfileBatches(keras.callbacks.Callback):
        trace = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == first:
                tf.profiler.experimental.start(logdir)
            if first <= batch <= last:
                self.trace = tf.profiler.experimental.Trace("train", step_num=batch, _r=1)
                self.trace.__enter__()

        def on_train_batch_end(self, batch, logs=None):
            if self.trace is not None:
                self.trace.__exit__(None, None, None)
                self.trace = None
            if batch == last:
                tf.profiler.experimental.stop()

    return ProfileBatches()
