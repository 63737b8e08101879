"""pytest plugin of the kept-mutant runs (``-p mutant_plugin`` with this folder on the path, so that it is the
harness's own copy, never one a patch touched).

- Every test outcome other than a pass in the setup or teardown, and every collection error, is written
  as one JSON line to the file named by ``TEYE_MUTANT_OUTCOMES``: the harness tells a failure of the
  named test itself from a collection error, a failing fixture or a skip.
- Each named test's kind (tests/kinds.py: ``measures`` or not) is written too, ``when`` "kind": the harness's
  caller runs mutants whose tests measure in the serial pass, one at a time.
- A property test expected to fail on a mutant stops at its first failing example (no shrinking) and
  keeps no example database.
"""
import json
import os

if os.environ.get("TEYE_MUTANT_HYPOTHESIS") != "0":   # (0: no named test's file mentions it; its import is 0.3 s)
    try:
        from hypothesis import Phase, settings
    except ImportError:  # a tree whose tests do not use Hypothesis
        pass
    else:
        settings.register_profile("teye-mutants", phases=(Phase.explicit, Phase.generate), database=None)
        settings.load_profile("teye-mutants")


def _write(nodeid, when, outcome, text=""):
    path = os.environ.get("TEYE_MUTANT_OUTCOMES")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"nodeid": nodeid, "when": when, "outcome": outcome, "text": text[-1500:]}) + "\n")


def pytest_collection_modifyitems(items):
    for item in items:
        _write(item.nodeid, "kind", "measures" if item.get_closest_marker("measures") else "parallel")


def pytest_collectreport(report):
    if report.failed:
        _write(report.nodeid, "collect", "failed", str(report.longrepr))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        text = str(report.longrepr) if report.longrepr is not None else ""
        _write(report.nodeid, report.when, report.outcome, text)
