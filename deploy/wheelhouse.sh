#!/usr/bin/env bash
# Build teye's wheelhouse: teye and every runtime dependency as wheels, for this machine's platform
# and Python, so that nodes install it with no network and no compiler (deploy/install.sh --from DIR).
#
#   deploy/wheelhouse.sh [--python PY] OUTDIR
#
# OUTDIR gets:
#   wheels/                  teye-<v>-py3-none-any.whl (pure Python) and one wheel per dependency (some
#                            built for this Python and platform)
#   teye-wheelhouse.json     what it was built for (Python, machine, glibc) and each wheel's sha256;
#                            install.sh checks it before touching the node
#   deploy/                  install.sh, the example config, the systemd unit, the Slurm scripts, the
#                            Prometheus, Alertmanager, Grafana and Kubernetes files, so the directory alone
#                            installs a node and the monitoring beside it
#   dashboards/json/         the Grafana dashboards (teye dashboards push uploads the installed copy)
# Needs PyPI (or a mirror pip is configured for), here only.
# OUTDIR is replaced whole, only once everything was built.
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=python3
OUT=
die() { printf 'teye-wheelhouse: error: %s\n' "$*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="${2:?--python needs an interpreter}"; shift ;;
        -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$OUT" ] || die "one output directory only"; OUT="$1" ;;
    esac
    shift
done
[ -n "$OUT" ] || die "no output directory (usage: deploy/wheelhouse.sh [--python PY] OUTDIR)"
OUT="$(mkdir -p "$(dirname "$OUT")" && cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"

TMP="$(mktemp -d "${OUT}.tmp.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# a private build venv: the host interpreter may lack pip, and its packages must not matter
"$PY" -m venv "$TMP/venv" || die "$PY cannot create a venv (Debian: apt-get install python3-venv)"
unset PIP_NO_BUILD_ISOLATION PIP_BUILD_ISOLATION PIP_NO_USE_PEP517 PIP_USE_PEP517
# teye from a clean copy of the tree (pip builds in place: keep build/ out of the checkout)
mkdir -p "$TMP/src"
for f in pyproject.toml setup.py README.md; do cp "$SRC/$f" "$TMP/src/"; done
for d in teye agent exporters workloads dashboards teye_client; do
    (cd "$SRC" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude='*.so' -cf - "$d") | (cd "$TMP/src" && tar -xf -)
done
# teye and its dependencies, with the kubernetes extra's (grpcio: the kubelet's pod-resources API) for the image
"$TMP/venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --prefer-binary \
    --wheel-dir "$TMP/out/wheels" "$TMP/src[kubernetes]" || die "pip could not build the wheels (see above)"
# what the READMEs tell admins to install beside the package: install.sh and the example config, the systemd
# unit, the Slurm scripts, the Prometheus configurations, rules and their tests, Alertmanager's and Grafana's
# provisioning, the Kubernetes objects, and the dashboards' JSON (tests/dist/test_wheelhouse.py checks every file
# the READMEs name is here).  Not the build tools (deploy/image, wheelhouse.sh, the generators).
(cd "$SRC" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude=deploy/image --exclude=deploy/wheelhouse.sh \
    --exclude='deploy/*/generate.py' -cf - deploy dashboards/json) | (cd "$TMP/out" && tar -xf -)
"$TMP/venv/bin/python" - "$TMP/out" <<'PY' || exit 1
import glob, hashlib, json, os, platform, sys, sysconfig, zipfile
out = sys.argv[1]
wheels = sorted(glob.glob(os.path.join(out, "wheels", "*.whl")))
(teye,) = [w for w in wheels if os.path.basename(w).startswith("teye-")]
impl = sys.implementation
libc, ver = platform.libc_ver()
manifest = {
    "teye": os.path.basename(teye).split("-")[1],
    "python": "%s%d%d" % ({"cpython": "cp"}.get(impl.name, impl.name), *sys.version_info[:2]),
    "python_version": "%d.%d" % sys.version_info[:2],
    "implementation": impl.name,
    "machine": platform.machine(),
    "platform": sysconfig.get_platform(),
    "glibc": ver if libc == "glibc" else None,
    "wheels": {os.path.basename(w): hashlib.sha256(open(w, "rb").read()).hexdigest() for w in wheels},
}
with open(os.path.join(out, "teye-wheelhouse.json"), "w") as fh:
    json.dump(manifest, fh, indent=1, sort_keys=True)
    fh.write("\n")
print("teye-wheelhouse: %d wheels for %s %s on %s (glibc %s)" % (len(wheels), impl.name, manifest["python_version"],
                                                                 manifest["machine"], manifest["glibc"]))
PY
rm -rf "$OUT"
mv "$TMP/out" "$OUT"
echo "teye-wheelhouse: built $OUT"
