"""EDAC memory-error counters against a sysfs tree laid out as the EDAC core does, with known counts."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources.edac import EdacSource
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition


def _w(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(f"{value}\n")


def test_counts_per_controller_and_row(tmp_path):
    mc = tmp_path / "devices" / "system" / "edac" / "mc"
    _w(str(mc / "mc0" / "ce_count"), 7)
    _w(str(mc / "mc0" / "ue_count"), 0)
    _w(str(mc / "mc0" / "csrow0" / "ce_count"), 5)
    _w(str(mc / "mc0" / "csrow0" / "ue_count"), 0)
    _w(str(mc / "mc0" / "csrow1" / "ce_count"), 2)
    _w(str(mc / "mc0" / "csrow1" / "ue_count"), 0)
    _w(str(mc / "mc1" / "ce_count"), 0)
    _w(str(mc / "mc1" / "ue_count"), 1)
    _w(str(mc / "power" / "x"), 0)  # not a controller
    s = Sampler({"edac": (EdacSource(str(tmp_path)), 15.0)})
    assert s.read_once("edac").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    got = {(n, tuple(v for _, v in l)): val for (n, l), val in out.items() if n.startswith("teye_edac_")}
    assert got == {
        ("teye_edac_correctable_errors_total", ("0",)): 7, ("teye_edac_uncorrectable_errors_total", ("0",)): 0,
        ("teye_edac_correctable_errors_total", ("1",)): 0, ("teye_edac_uncorrectable_errors_total", ("1",)): 1,
        ("teye_edac_csrow_correctable_errors_total", ("0", "0")): 5,
        ("teye_edac_csrow_uncorrectable_errors_total", ("0", "0")): 0,
        ("teye_edac_csrow_correctable_errors_total", ("0", "1")): 2,
        ("teye_edac_csrow_uncorrectable_errors_total", ("0", "1")): 0,
    }


def test_no_edac_exports_nothing_and_is_up(tmp_path):
    s = Sampler({"edac": (EdacSource(str(tmp_path)), 15.0)})
    assert s.read_once("edac").up and list(EdacSource(str(tmp_path)).collect().points()) == []


@pytest.mark.parametrize("bad", ["-1", "x", "²", "3 4"])
def test_a_garbled_count_is_a_parse_error(tmp_path, bad):
    _w(str(tmp_path / "devices" / "system" / "edac" / "mc" / "mc0" / "ce_count"), bad)
    with pytest.raises(ParseError, match="expected a count"):
        EdacSource(str(tmp_path)).collect()
