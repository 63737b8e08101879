"""Data flows one way: a lower module never imports a higher one.

Sources and backends (agent/sources, agent/gpu, agent/pmu, agent/phases) sit below the
sampler, the exporters and the commands; only the commands (agent/cli.py and the entry point)
may import agent.cli. Checked on the import statements themselves, so a lazy import inside a
function counts too.
"""
from __future__ import annotations

import ast
import os

from tests.procs import REPO

HIGHER = ("agent.cli", "agent.daemon", "agent.profile", "agent.doctor", "agent.run", "exporters")
LOWER_PACKAGES = ("agent/sources", "agent/gpu", "agent/pmu", "agent/phases")


def imports(path: str, root: str = REPO):
    """Absolute module names imported by ``path`` (relative imports resolved against its package)."""
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    package = rel.rsplit(".", 1)[0] if not rel.endswith("__init__") else rel[: -len(".__init__")]
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            for a in node.names:  # "from . import cli" names the module in the alias
                yield f"{mod}.{a.name}" if mod else a.name


def python_files(*dirs, top: str = REPO):
    for d in dirs:
        for root, _, files in os.walk(os.path.join(top, d)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


def offenders(files, forbidden, root: str = REPO):
    out = []
    for path in files:
        for mod in imports(path, root):
            if any(mod == h or mod.startswith(h + ".") for h in forbidden):
                out.append(f"{os.path.relpath(path, root)} imports {mod}")
    return out


def test_lower_rooms_never_import_higher_ones():
    assert offenders(python_files(*LOWER_PACKAGES), HIGHER) == []


def test_only_the_entry_point_imports_the_cli():
    files = [p for p in python_files("agent", "exporters", "workloads", "dashboards")
             if os.path.relpath(p, REPO) not in ("agent/cli.py", "agent/__main__.py")]
    assert offenders(files, ("agent.cli",)) == []


def test_the_client_room_imports_no_other_room():
    """teye_client runs inside users' jobs: it never imports the agent, exporters, workloads or dashboards
    (tests/client/test_compat.py checks it imports the standard library only)."""
    assert offenders(python_files("teye_client"), ("agent", "exporters", "workloads", "dashboards")) == []


def test_the_checker_catches_the_shapes_it_looks_for(tmp_path):
    """The oracle for the two tests above: lazy, relative and aliased imports of a higher room are caught."""
    (tmp_path / "agent" / "gpu").mkdir(parents=True)
    (tmp_path / "agent" / "gpu" / "bad.py").write_text(
        "import json\n"
        "def main(args):\n"
        "    from ..cli import load_config\n"
        "    from ... import exporters\n"
        "from agent import daemon\n")
    (tmp_path / "agent" / "gpu" / "good.py").write_text("from .nvml import load\nfrom ..errors import ParseError\n")
    found = offenders(python_files("agent", top=str(tmp_path)), HIGHER, root=str(tmp_path))
    assert sorted(found) == ["agent/gpu/bad.py imports agent.cli", "agent/gpu/bad.py imports agent.cli.load_config",
                             "agent/gpu/bad.py imports agent.daemon", "agent/gpu/bad.py imports exporters"]
