"""Fake `scontrol` and `sacctmgr` for the epilog tests: the Slurm command-line boundary, nothing above it."""
from __future__ import annotations

import os
import stat
import sys

from tests.procs import REPO

EPILOG = os.path.join(REPO, "deploy", "slurm", "teye-epilog.sh")


def _script(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def install(bin_dir: str, calls: str, cpus: int = 4, mem: str = "64G", teye_sleep: float = 0.0) -> dict:
    """scontrol answers `show job -o ID` with the allocation; sacctmgr appends its arguments (one per line,
    then '--') to ``calls``; teye runs this tree's agent (after sleeping ``teye_sleep`` s) and keeps its arguments
    in bin_dir/teye.args (``teye_args``).  Returns the env."""
    os.makedirs(bin_dir, exist_ok=True)
    _script(os.path.join(bin_dir, "scontrol"),
            '#!/bin/sh\n[ "$1 $2 $3" = "show job -o" ] || exit 1\n'
            f'echo "JobId=$4 JobName=train UserId=alice(1000) JobState=COMPLETED NumNodes=2 NumCPUs={cpus} '
            f'MinMemoryNode={mem} TRES=cpu={cpus},mem={mem},node=2,gres/gpu=2"\n')
    _script(os.path.join(bin_dir, "sacctmgr"),
            f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> {calls}; done\necho -- >> {calls}\n')
    _script(os.path.join(bin_dir, "teye"),
            f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {bin_dir}/teye.args\nsleep {teye_sleep}\n"
            f"PYTHONPATH={REPO} exec {sys.executable} -m agent \"$@\"\n")
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "TEYE_BIN": os.path.join(bin_dir, "teye")}


def stored(calls: str) -> list:
    """The AdminComment values sacctmgr was asked to set."""
    if not os.path.exists(calls):
        return []
    out = []
    for line in open(calls).read().splitlines():
        if line.startswith("AdminComment="):
            out.append(line[len("AdminComment="):])
    return out


def teye_args(bin_dir: str) -> list:
    """The arguments the epilog gave teye last time."""
    with open(os.path.join(bin_dir, "teye.args")) as fh:
        return fh.read().splitlines()
