#!/usr/bin/env bash
# Set up and run teye on a fresh Debian machine.
#   ./dev.sh agent [teye agent flags...]   create .venv, install teye, run the agent (embedded defaults, :9835)
#   ./dev.sh test  [pytest args...]        install test tools (Prometheus, promtool, a C compiler), create
#                                          .venv with every extra, run the whole test suite
set -euo pipefail
cd "$(dirname "$0")"

VENV=${TEYE_VENV:-.venv}
PY=${PYTHON:-python3}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    echo "dev.sh: installing Debian packages: $*" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PY" -m venv "$VENV" 2>/dev/null; then
            apt_install python3-venv
            rm -rf "$VENV"
            "$PY" -m venv "$VENV"
        fi
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e ".$1"
}

case "${1:-}" in
agent)
    shift
    make_venv ""
    exec "$VENV/bin/teye" agent "$@"
    ;;
test)
    shift
    need=()
    command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
    command -v amtool >/dev/null || need+=(prometheus-alertmanager)
    command -v systemd-analyze >/dev/null || need+=(systemd)
    # the phase path's C helpers (agent/phases/_fast.c): the tests check them against the Python code
    command -v cc >/dev/null && [ -e /usr/include/stdio.h ] || need+=(gcc libc6-dev)
    "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || need+=(python3-dev)
    if [ ${#need[@]} -gt 0 ]; then apt_install "${need[@]}"; fi
    make_venv "[dev,workloads-cpu,dashboards,plots,torch,kubernetes]"
    export TEYE_REQUIRE_FAST=1  # a C helper that failed to build fails its tests instead of skipping them
    set +e
    "$VENV/bin/python" -m pytest "$@"
    rc=$?
    set -e
    if [ $rc = 5 ]; then
        echo "dev.sh: pytest collected no tests: that is a failure, not a pass" >&2
        exit 1
    fi
    exit $rc
    ;;
*)
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
