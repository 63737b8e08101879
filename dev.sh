#!/usr/bin/env bash
# Set up and run teye on a fresh Debian machine.
#   ./dev.sh agent [teye agent flags...]   create .venv, install teye, run the agent (embedded defaults, :9835)
#   ./dev.sh test  [pytest args...]        install test tools (Prometheus, promtool, a C compiler, podman,
#                                          mmdebstrap, node), create .venv with every extra, run the whole test suite
#   ./dev.sh dist                          build dist/: the wheelhouse (teye + every dependency as wheels, for
#                                          this platform and Python) and the OCI image built from it
set -euo pipefail
cd "$(dirname "$0")"

VENV=${TEYE_VENV:-.venv}
PY=${PYTHON:-python3}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    echo "dev.sh: installing Debian packages: $*" >&2
    # another apt or unattended-upgrades holding the dpkg lock: wait for it (up to 10 minutes), not fail at once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "$@" >/dev/null
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PY" -m venv "$VENV" 2>/dev/null; then
            apt_install python3-venv
            rm -rf "$VENV"
            "$PY" -m venv "$VENV"
        fi
    fi
    # reinstall only when the packaging or the extras changed (an editable install follows the sources)
    local stamp="$VENV/.teye-installed" want
    want="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1) $1"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/teye" ]; then
        return 0
    fi
    # (pip's notices, its version check and "running as root", are not what a newcomer needs to read first)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --root-user-action=ignore --upgrade pip \
        >/dev/null
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e ".$1" 2>&1 \
        | grep -v -i "editable" >&2 || true
    [ -x "$VENV/bin/teye" ] || { echo "dev.sh: installing teye failed" >&2; exit 1; }
    echo "$want" > "$stamp"
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
    # node_exporter beside teye: the oracle of tests/e2e/test_node_exporter_parity.py and benchmarks/web.py's peer
    command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)
    command -v systemd-analyze >/dev/null || need+=(systemd)
    # network namespaces, veth pairs and tbf shaping (tests/netns.py), nstat (tests/sources/test_netstat.py)
    command -v ip >/dev/null && command -v tc >/dev/null && command -v nstat >/dev/null || need+=(iproute2)
    # the image test (tests/dist/test_image.py): mmdebstrap builds the root filesystem, podman runs it
    # (runc: crun refuses hybrid cgroup hosts); node runs the prometheus-operator CRD schemas (test_kubernetes.py)
    command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
    command -v podman >/dev/null || need+=(podman)
    command -v runc >/dev/null || need+=(runc)
    command -v node >/dev/null && command -v npm >/dev/null || need+=(nodejs npm)
    # a C compiler: tests/sources/test_timex.py builds its reference program (adjtimex) with it
    command -v cc >/dev/null && [ -e /usr/include/stdio.h ] || need+=(gcc libc6-dev)
    if [ ${#need[@]} -gt 0 ]; then apt_install "${need[@]}"; fi
    make_venv "[dev,workloads-cpu,dashboards,plots,torch,frameworks,kubernetes]"
    (cd tests/deploy/crd_schemas && npm ci --no-audit --no-fund --silent)
    # the wheelhouse the tests/dist tests install from (built here, while the network is used anyway)
    TEYE_WHEELHOUSE="$(cd "$VENV" && pwd)/wheelhouse"
    deploy/wheelhouse.sh --python "$PY" "$TEYE_WHEELHOUSE" >/dev/null
    export TEYE_WHEELHOUSE
    # compiled modules kept (__pycache__, git-ignored): hundreds of processes (agents, jobs, the mutants'
    # pytest runs) import the same code; an environment that says not to write them would compile it each time
    unset PYTHONDONTWRITEBYTECODE
    # two passes: the tests that do not measure on four pytest-xdist workers, then those marked measures alone
    exec tests/passes.sh "$VENV/bin/python" "$@"
    ;;
dist)
    # dist/wheelhouse (deploy/install.sh --from dist/wheelhouse installs it on a node with no network),
    # the same as one .tar.gz, and the OCI image dist/teye-<version>.oci.tar built from it
    command -v mmdebstrap >/dev/null && command -v podman >/dev/null || apt_install mmdebstrap podman runc
    command -v cc >/dev/null && [ -e /usr/include/stdio.h ] || apt_install gcc libc6-dev python3-dev
    rm -rf dist/wheelhouse
    deploy/wheelhouse.sh --python "$PY" dist/wheelhouse
    tag=$("$PY" -c 'import json; m = json.load(open("dist/wheelhouse/teye-wheelhouse.json")); print("teye-%s-%s-%s" % (m["teye"], m["python"], m["platform"].replace("-", "_")))')
    tar -C dist -czf "dist/$tag-wheelhouse.tar.gz" --transform "s|^wheelhouse|$tag|" wheelhouse
    version=$("$PY" -c 'import json; print(json.load(open("dist/wheelhouse/teye-wheelhouse.json"))["teye"])')
    as_root deploy/image/build.sh --tag "localhost/teye:$version" dist/wheelhouse "dist/teye-$version.oci.tar"
    ls -l dist/ >&2
    ;;
*)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
