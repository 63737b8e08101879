"""Packaging beyond pyproject.toml: where the packages go (pure Python: issue 38 removed the phase path's C helpers).

Installed layout (the repository's keeps ``agent/``, ``exporters/``, ``workloads/``, ``dashboards/`` at
the top): those generic names are installed under ``teye/_lib/``, a directory only the ``teye``
launcher (teye/__init__.py) puts on ``sys.path``, so an install adds no top-level name a user's
project could collide with; ``teye`` (the launcher) and ``teye_client`` (imported by users' jobs)
are the only top-level packages.
"""
from setuptools import find_packages, setup

PRIVATE = ("agent", "exporters", "workloads", "dashboards")   # = teye.PRIVATE
LIB = "teye._lib"

private = find_packages(include=[f"{p}{tail}" for p in PRIVATE for tail in ("", ".*")])
public = find_packages(include=["teye", "teye_client", "teye_client.*"])

setup(
    # dashboards/json (data) and teye_client/_site (the directory `teye run` puts first on PYTHONPATH, no
    # __init__.py) are listed as packages of their own, or setuptools warns that each would be ignored
    packages=public + [f"{LIB}.{p}" for p in private] + [f"{LIB}.dashboards.json", "teye_client._site"],
    package_dir={LIB: "."},
    package_data={f"{LIB}.dashboards.json": ["*.json"], "teye_client._site": ["sitecustomize.py"]},
)
