"""Shared test fixtures: paths to the captured node_exporter trees and its golden output."""
from __future__ import annotations

import os
import re
import sys
from typing import Dict, Tuple

import pytest

import tests.reference  # noqa: F401  (first: it keeps the environment the session started with)

# the suite's kinds of test (measures: the serial pass), its passes, the shuffle and the workers' checks
pytest_plugins = ["tests.kinds"]

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
NODE_EXPORTER = os.path.join(DATA, "node_exporter")  # copy of ../shared/fixtures/node_exporter (see SOURCE.md)
PROCFS = os.path.join(NODE_EXPORTER, "proc")
SYSFS = os.path.join(NODE_EXPORTER, "sys")

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """Prometheus text format -> {(name, sorted label pairs): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


@pytest.fixture(scope="session")
def node_exporter_golden():
    """node_exporter's own /metrics for the fixture trees: {(name, labels): value}."""
    with open(os.path.join(NODE_EXPORTER, "e2e-output.txt"), encoding="utf-8") as fh:
        return parse_exposition(fh.read())


def pytest_terminal_summary(terminalreporter):
    """How many of the serial pass's bare runs its tests took from the first pass (tests/reference.py)."""
    ref = sys.modules.get("tests.reference")
    if ref is not None and os.environ.get(ref.DIR_ENV) and (ref.MADE["ahead"] or ref.MADE["here"]):
        terminalreporter.write_line(f"bare runs: {ref.MADE['ahead']} made ahead by the first pass, "
                                    f"{ref.MADE['here']} made by their tests")


def reading_series(reading) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """{(name, sorted label pairs): value} from a reading's points, like parse_exposition; fails on duplicates."""
    out = {}
    for p in reading.points():
        if p.value is not None:
            key = (p.spec.name, tuple(sorted(zip(p.spec.labels, p.labels))))
            assert key not in out, f"duplicate series {key}"
            out[key] = float(p.value)
    return out


def golden(values, name: str, **labels) -> float:
    """Look up one golden value by name and exact labels (KeyError when absent)."""
    return values[(name, tuple(sorted(labels.items())))]
