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

HIGHER = ("agent.cli", "agent.daemon", "agent.profile", "agent.doctor", "agent.report", "agent.run", "exporters")
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


# Rooms whose modules must not import each other in a circle (a lazy import inside a function
# counts too: it only hides the circle until the day someone moves it to the top).
ROOMS = ("agent", "agent/sources", "agent/gpu", "agent/pmu", "agent/phases", "agent/trace", "exporters", "workloads",
         "dashboards", "teye_client")


def module_name(path: str, root: str = REPO) -> str:
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def import_cycles(room: str, root: str = REPO):
    """Circles of imports among the modules directly inside ``room`` (each circle once, as 'a -> b -> a')."""
    top = os.path.join(root, room)
    files = [os.path.join(top, f) for f in sorted(os.listdir(top)) if f.endswith(".py")] if os.path.isdir(top) else []
    mods = {module_name(p, root): p for p in files}
    graph = {m: sorted({i for i in imports(p, root) if i in mods and i != m}) for m, p in mods.items()}
    cycles, seen = [], set()
    # a package importing its own submodules is not a circle: importing a submodule always runs the package first
    package = module_name(os.path.join(top, "__init__.py"), root)

    def walk(node, path):
        for nxt in graph[node]:
            if nxt == package:
                continue
            if nxt in path:
                circle = path[path.index(nxt):]
                i = circle.index(min(circle))
                key = tuple(circle[i:] + circle[:i])
                if key not in seen:
                    seen.add(key)
                    cycles.append(" -> ".join(key + (key[0],)))
            else:
                walk(nxt, path + [nxt])

    for m in sorted(graph):
        walk(m, [m])
    return cycles


def test_no_import_cycles_inside_a_room():
    found = {room: import_cycles(room) for room in ROOMS}
    assert {room: c for room, c in found.items() if c} == {}


def test_the_cycle_checker_catches_lazy_and_relative_circles(tmp_path):
    """The oracle for the test above: a circle closed by a lazy relative import is found, once."""
    (tmp_path / "exporters").mkdir()
    (tmp_path / "exporters" / "__init__.py").write_text("")
    (tmp_path / "exporters" / "a.py").write_text("from .b import x\nfrom . import c\n")
    (tmp_path / "exporters" / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "exporters" / "c.py").write_text("import exporters\nfrom exporters import d\n")
    (tmp_path / "exporters" / "d.py").write_text("from exporters.c import z\n")
    (tmp_path / "exporters" / "e.py").write_text("import exporters.a\n")
    assert import_cycles("exporters", root=str(tmp_path)) == ["exporters.a -> exporters.b -> exporters.a",
                                                              "exporters.c -> exporters.d -> exporters.c"]


def test_the_client_instrumentors_import_only_their_shared_module():
    """Issue 38: the import hook (teye_client.auto) loads the instrumentors; they and it share the session and
    helpers through teye_client._common, which imports neither (one instrumentor per library, shared helpers
    in a module of their own)."""
    own = {}
    for name in ("_torch", "_tf", "_common", "_config"):
        path = os.path.join(REPO, "teye_client", name + ".py")
        own[name] = sorted({m for m in imports(path) if m.startswith("teye_client")})
    shared = ["teye_client._common", "teye_client._common.batch_size", "teye_client._common.debug",
              "teye_client._common.session", "teye_client._common.wrapper_of"]
    # issue 45: PyTorch's instrumentor hands what it holds to the job's configuration (teye_client._config,
    # PyTorch's settings beside its instrumentor), which shares only the session and helpers
    # issue 46: `teye trace`'s job side (teye_client._trace, which shares only the reporter's directory check) is
    # made by the shared hook (_common.TraceHook) with each framework's profile: PyTorch's in _trace, TensorFlow's
    # in a module of its own (teye_client._tftrace, which imports nothing of teye's)
    hook = ["teye_client", "teye_client._common.TraceHook"]
    assert own["_tf"] == sorted(shared + hook + ["teye_client._tftrace"])
    assert own["_torch"] == sorted(shared + hook + ["teye_client._config"])
    assert sorted({m for m in imports(os.path.join(REPO, "teye_client", "_trace.py")) if m.startswith("teye_client")}) \
        == ["teye_client.reporter", "teye_client.reporter.dir_problem"]
    assert [m for m in imports(os.path.join(REPO, "teye_client", "_tftrace.py")) if m.startswith("teye_client")] == []
    assert own["_config"] == ["teye_client._common", "teye_client._common.debug", "teye_client._common.session",
                              "teye_client._common.wrapper_of"]
    assert [m for m in own["_common"] if not m.startswith("teye_client.reporter")] == ["teye_client",
                                                                                       "teye_client._trace"]
