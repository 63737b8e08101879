"""The textfile collector: files written as sites' scripts write them, read back through both of teye's
exposition paths and parsed by prometheus_client's own parser; each kind of bad file skipped alone."""
from __future__ import annotations

import os
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.sampler import Sampler
from agent.sources.textfile import TextfileSource
from exporters.prometheus import make_registry
from exporters.render import render

GOOD = """# HELP site_health_check_ok 1 when the site's node health check passed.
# TYPE site_health_check_ok gauge
site_health_check_ok{check="gpu_burn"} 1
site_health_check_ok{check="ib_bw"} 0
# HELP site_node_drains_total Times this node was drained.
# TYPE site_node_drains_total counter
site_node_drains_total 3
# a comment, then an untyped sample without HELP or TYPE
site_rack_position 12
"""


def _samples(src):
    """{(name, sorted labels): value} from both exposition paths (client_python's and teye's own renderer),
    which must agree, each parsed by prometheus_client's parser."""
    s = Sampler({"textfile": (src, 15.0)})
    st = s.read_once("textfile")
    assert st.up, st.error
    out = []
    reg = make_registry(lambda: s.snapshot)
    for text in (generate_latest(reg).decode(), render(reg)[0].decode()):
        got, types = {}, {}
        for fam in text_string_to_metric_families(text):
            types[fam.name] = fam.type
            for x in fam.samples:
                if x.name.startswith(("site_", "teye_textfile_")):
                    got[(x.name, tuple(sorted(x.labels.items())))] = x.value
        out.append((got, types))
    assert out[0] == out[1]
    return out[0]


def test_a_sites_file_is_exported_as_written(tmp_path):
    (tmp_path / "health.prom").write_text(GOOD)
    (tmp_path / "notes.txt").write_text("not a .prom file\n")
    got, types = _samples(TextfileSource(str(tmp_path)))
    assert got == {
        ("site_health_check_ok", (("check", "gpu_burn"),)): 1.0,
        ("site_health_check_ok", (("check", "ib_bw"),)): 0.0,
        ("site_node_drains_total", ()): 3.0,
        ("site_rack_position", ()): 12.0,
        ("teye_textfile_mtime_seconds", (("file", str(tmp_path / "health.prom")),)):
            float(int(os.stat(tmp_path / "health.prom").st_mtime)),
        ("teye_textfile_scrape_error", ()): 0.0,
    }
    assert types["site_health_check_ok"] == "gauge" and types["site_node_drains"] == "counter"


BAD = {
    "syntax.prom": "site_a{x=\"1\" 1\n",
    "half_written.prom": "# TYPE site_b gauge\nsite_b{node=\"n1\"} 4\nsite_b{node=\"n",
    "clash_teye.prom": "teye_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 1\n",
    "clash_process.prom": "process_open_fds 3\n",
    "duplicate_series.prom": "site_health_check_ok{check=\"gpu_burn\"} 0\n",
    "type_clash.prom": "# TYPE site_rack_position_total counter\nsite_rack_position_total 1\n",
    "timestamp.prom": "site_c 1 1700000000000\n",
    "histogram.prom": "# TYPE site_h histogram\nsite_h_bucket{le=\"+Inf\"} 1\nsite_h_sum 1\nsite_h_count 1\n",
    "not_utf8.prom": b"site_d{x=\"\xff\"} 1\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_bad_file_is_skipped_alone_counted_and_named(tmp_path, name, caplog):
    (tmp_path / "a_health.prom").write_text(GOOD)  # read first (by name): the other file clashes with it
    content = BAD[name]
    (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    caplog.set_level("WARNING", logger="teye.textfile")
    got, _ = _samples(TextfileSource(str(tmp_path)))
    assert got[("teye_textfile_scrape_error", ())] == 1.0
    assert ("teye_textfile_mtime_seconds", (("file", str(tmp_path / name)),)) not in got
    assert ("teye_textfile_mtime_seconds", (("file", str(tmp_path / "a_health.prom")),)) in got
    assert got[("site_health_check_ok", (("check", "gpu_burn"),))] == 1.0  # the first file's value, unchanged
    assert not [k for k in got if k[0] in ("site_a", "site_b", "site_c", "site_d", "site_h_bucket", "site_h_sum",
                                            "site_h_count", "site_rack_position_total")]
    assert sum(1 for k in got if k[0].startswith("site_")) == 4  # the first file's four series, nothing else
    assert [r for r in caplog.records if name in r.getMessage() and "skipped" in r.getMessage()]


@pytest.mark.measures("a timed assertion: the read does not block")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "health.prom").write_text(GOOD)
    os.mkfifo(tmp_path / "pipe.prom")
    t0 = time.monotonic()
    got, _ = _samples(TextfileSource(str(tmp_path)))
    assert time.monotonic() - t0 < 5
    assert got[("teye_textfile_scrape_error", ())] == 1.0 and got[("site_node_drains_total", ())] == 3.0


def test_a_huge_file_is_refused(tmp_path):
    (tmp_path / "big.prom").write_text("site_x 1\n" + "# padding\n" * 500_000)
    got, _ = _samples(TextfileSource(str(tmp_path)))
    assert got == {("teye_textfile_scrape_error", ()): 1.0}


def test_no_directory_configured_reads_nothing_and_a_missing_one_is_an_error(tmp_path):
    got, _ = _samples(TextfileSource(None))
    assert got == {("teye_textfile_scrape_error", ()): 0.0}
    got, _ = _samples(TextfileSource(str(tmp_path / "nope")))
    assert got == {("teye_textfile_scrape_error", ()): 1.0}


def test_a_file_rewritten_between_reads_is_read_anew(tmp_path):
    src = TextfileSource(str(tmp_path))
    (tmp_path / "h.prom.tmp").write_text("site_v 1\n")
    os.rename(tmp_path / "h.prom.tmp", tmp_path / "h.prom")
    assert _samples(src)[0][("site_v", ())] == 1.0
    (tmp_path / "h.prom.tmp").write_text("site_v 2\n")
    os.rename(tmp_path / "h.prom.tmp", tmp_path / "h.prom")
    assert _samples(src)[0][("site_v", ())] == 2.0


# -- issue 48: the log never quotes a file; a symbolic link out of the directory is not followed -----------------

SECRET = "root:$y$j9T$c2VjcmV0c2FsdA$S3cr3tHashThatMustNeverBeLogged:19000:0:99999:7:::\n"


def _logged(caplog):
    return "\n".join(r.getMessage() for r in caplog.records)


@pytest.fixture
def outside(tmp_path):
    """A root-only file and a metrics file, outside the textfile directory ``tmp_path / "tf"``."""
    (tmp_path / "tf").mkdir()
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    (tmp_path / "elsewhere.prom").write_text(GOOD)
    return tmp_path


@pytest.mark.parametrize("follow", [False, True])
def test_a_link_to_a_root_only_file_never_reaches_the_log(outside, caplog, follow):
    from agent.sources import textfile
    textfile.log._last.clear()   # (the rate limit's memory of earlier tests)
    os.symlink(outside / "shadow", outside / "tf" / "shadow.prom")
    got, _ = _samples(TextfileSource(str(outside / "tf"), follow_symlinks=follow))
    assert got == {("teye_textfile_scrape_error", ()): 1.0}
    text = _logged(caplog)
    for piece in ("root:", "$y$", "S3cr3t", "19000"):
        assert piece not in text
    why = ("a symbolic link leading out of the directory (textfile.follow_symlinks is off)" if not follow
           else "not the Prometheus text format: line 1: a malformed line or a value that is not a number")
    assert f"shadow.prom skipped: {why}" in text


def test_a_link_out_is_skipped_unless_configured_and_a_link_inside_is_read(outside, caplog):
    os.symlink(outside / "elsewhere.prom", outside / "tf" / "out.prom")
    got, _ = _samples(TextfileSource(str(outside / "tf")))
    assert got == {("teye_textfile_scrape_error", ()): 1.0}
    got, _ = _samples(TextfileSource(str(outside / "tf"), follow_symlinks=True))
    assert got[("site_node_drains_total", ())] == 3.0 and got[("teye_textfile_scrape_error", ())] == 0.0
    os.unlink(outside / "tf" / "out.prom")
    (outside / "tf" / "real.txt").write_text(GOOD)
    os.symlink("real.txt", outside / "tf" / "in.prom")          # a relative link to a file in the directory
    got, _ = _samples(TextfileSource(str(outside / "tf")))
    assert got[("site_node_drains_total", ())] == 3.0 and got[("teye_textfile_scrape_error", ())] == 0.0


def test_the_descriptor_is_checked_not_the_name(outside):
    """The check is of the file opened: a link swapped in after any check of its name is still refused."""
    from agent.sources._files import Outside, read_bytes
    link = outside / "tf" / "x.prom"
    os.symlink(outside / "elsewhere.prom", link)
    with pytest.raises(Outside):
        read_bytes(str(link), within=os.path.realpath(outside / "tf"))
    assert read_bytes(str(link), within=os.path.realpath(outside)) == GOOD.encode()


def test_a_bad_line_is_named_by_number_without_its_content(tmp_path, caplog):
    from agent.sources import textfile
    textfile.log._last.clear()
    (tmp_path / "bad.prom").write_text("# TYPE site_a gauge\nsite_a 1\nsite_a{k=\"v\"} hunter2-password\n")
    (tmp_path / "binary.prom").write_bytes(b"site_b 1\n\xffsecret-bytes\n")
    got, _ = _samples(TextfileSource(str(tmp_path)))
    assert got == {("teye_textfile_scrape_error", ()): 1.0}
    text = _logged(caplog)
    assert "bad.prom skipped: not the Prometheus text format: line 3: " in text
    assert "binary.prom skipped: not UTF-8 (byte 9)" in text
    assert "hunter2" not in text and "secret-bytes" not in text and "\\xff" not in text
