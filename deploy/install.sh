#!/usr/bin/env bash
# Install the teye agent on a GPU node as a systemd service.
#
#   sudo deploy/install.sh               # install or upgrade (idempotent)
#   sudo DIR/deploy/install.sh --from DIR   # ... from a wheelhouse (./dev.sh dist): no network, no compiler
#   sudo deploy/install.sh --uninstall   # remove the service, venv and user (keeps /etc/teye)
#   sudo deploy/install.sh --uninstall --purge   # ... and /etc/teye
#   deploy/install.sh --dry-run          # print what would be done, change nothing
#
# What it does:
#   1. creates the system user "teye" (no login, no home);
#   2. creates a Python venv under /opt/teye/venv and installs teye from this repository, or with
#      --from DIR from a wheelhouse (teye and every dependency as wheels, built by ./dev.sh dist on a
#      machine with the same platform and Python: checked first, a mismatch changes nothing);
#   3. writes /etc/teye/teye.yml from deploy/teye.example.yml when absent (an existing
#      config is never overwritten; the new example goes to teye.yml.example);
#   4. installs deploy/systemd/teye-agent.service to /etc/systemd/system, then
#      daemon-reload, enable --now (restart when it was already running);
#   5. installs the zero-code phase directory at /opt/teye/site (sitecustomize.py and the
#      teye_client package, root-owned, read-only, byte-compiled): a Slurm TaskProlog or a pod
#      puts it first on PYTHONPATH (deploy/slurm/, docs/zero-code.md).
# Without systemd it installs everything else and prints how to start the agent by hand;
# without an NVIDIA driver it says so (the GPU collector is then absent: no alert, nothing to turn off).
#
# Options (mostly for packaging and tests):
#   --prefix DIR      venv location parent (default /opt/teye)
#   --etc DIR         config directory (default /etc/teye)
#   --unit-dir DIR    systemd unit directory (default /etc/systemd/system)
#   --source DIR      teye source tree to install (default: this repository)
#   --from DIR        install from a wheelhouse instead (pip --no-index: no network, no compiler);
#                     pip may take exactly the wheels teye-wheelhouse.json lists, each pinned by its
#                     sha256 (--require-hashes); an unlisted file in wheels/ is refused first
#   --python PY       interpreter for the venv (default python3, >= 3.9)
#   --system-site-packages   let the venv see the system's Python packages (runtime only:
#                     teye itself is still built in an isolated environment)
#   --no-user         do not create or remove the teye user
#   --no-systemd      do not call systemctl (install the unit file only)
#   --dry-run         print the actions instead of running them
set -euo pipefail

PREFIX=/opt/teye
ETC=/etc/teye
UNIT_DIR=/etc/systemd/system
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELHOUSE=
PYTHON=python3
MODE=install
PURGE=0
DRY_RUN=0
MANAGE_USER=1
USE_SYSTEMD=auto
VENV_ARGS=()
SERVICE_USER=teye
UNIT_NAME=teye-agent.service
# Probes, overridable so tests can simulate hosts with or without systemd / NVIDIA.
SYSTEMD_RUNTIME_DIR="${SYSTEMD_RUNTIME_DIR:-/run/systemd/system}"
NVIDIA_DRIVER_FILE="${NVIDIA_DRIVER_FILE:-/proc/driver/nvidia/version}"

say() {
    if [ "$DRY_RUN" = 1 ]; then printf 'teye-install: (dry run) %s\n' "$*"; else printf 'teye-install: %s\n' "$*"; fi
}
die() { printf 'teye-install: error: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# run CMD...: execute, or print it in --dry-run mode.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf 'would run:'; printf ' %q' "$@"; printf '\n'
    else
        "$@"
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        --uninstall) MODE=uninstall ;;
        --purge) PURGE=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --no-user) MANAGE_USER=0 ;;
        --no-systemd) USE_SYSTEMD=no ;;
        --system-site-packages) VENV_ARGS+=(--system-site-packages) ;;
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift ;;
        --etc) ETC="${2:?--etc needs a directory}"; shift ;;
        --unit-dir) UNIT_DIR="${2:?--unit-dir needs a directory}"; shift ;;
        --source) SOURCE="${2:?--source needs a directory}"; shift ;;
        --from) WHEELHOUSE="${2:?--from needs a wheelhouse directory}"; shift ;;
        --python) PYTHON="${2:?--python needs an interpreter}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

VENV="$PREFIX/venv"
TEYE_BIN="$VENV/bin/teye"
CONFIG="$ETC/teye.yml"
UNIT="$UNIT_DIR/$UNIT_NAME"

if [ "$USE_SYSTEMD" = auto ]; then
    if [ -d "$SYSTEMD_RUNTIME_DIR" ] && command -v systemctl >/dev/null 2>&1; then
        USE_SYSTEMD=yes
    else
        USE_SYSTEMD=no
        say "systemd is not running on this host ($SYSTEMD_RUNTIME_DIR missing): the unit file is installed but not enabled or started"
    fi
fi

if [ "$DRY_RUN" = 0 ] && [ "$MANAGE_USER" = 1 ] && [ "$(id -u)" != 0 ]; then
    die "run as root (or pass --no-user with --prefix/--etc/--unit-dir you can write)"
fi

# ------------------------------------------------------------------ uninstall
if [ "$MODE" = uninstall ]; then
    if [ "$USE_SYSTEMD" = yes ]; then
        if systemctl list-unit-files "$UNIT_NAME" >/dev/null 2>&1; then
            run systemctl disable --now "$UNIT_NAME" || true
        fi
    fi
    if [ -e "$UNIT" ]; then run rm -f "$UNIT"; say "removed $UNIT"; fi
    if [ "$USE_SYSTEMD" = yes ]; then run systemctl daemon-reload; fi
    if [ -d "$VENV" ]; then run rm -rf "$VENV"; say "removed $VENV"; fi
    if [ -d "$PREFIX/site" ]; then run rm -rf "$PREFIX/site"; say "removed $PREFIX/site"; fi
    if [ -d "$PREFIX" ]; then run rmdir "$PREFIX" 2>/dev/null || true; fi
    if [ "$PURGE" = 1 ]; then
        if [ -d "$ETC" ]; then run rm -rf "$ETC"; say "removed $ETC"; fi
    elif [ -d "$ETC" ]; then
        say "kept the configuration in $ETC (use --purge to remove it)"
    fi
    if [ "$MANAGE_USER" = 1 ] && getent passwd "$SERVICE_USER" >/dev/null 2>&1; then
        run userdel "$SERVICE_USER"
        say "removed user $SERVICE_USER"
    fi
    say "teye uninstalled"
    exit 0
fi

# -------------------------------------------------------------------- install
if [ -n "$WHEELHOUSE" ]; then
    WHEELHOUSE="$(cd "$WHEELHOUSE" 2>/dev/null && pwd)" || die "no wheelhouse directory $WHEELHOUSE"
    [ -f "$WHEELHOUSE/teye-wheelhouse.json" ] \
        || die "$WHEELHOUSE is not a teye wheelhouse (teye-wheelhouse.json missing; build one with ./dev.sh dist)"
    FILES="$WHEELHOUSE/deploy"      # the example config and the unit travel with the wheels
    # pip takes exactly the manifest: a requirements file of the listed wheels, each with its sha256,
    # written below once the wheelhouse is checked (no --find-links: pip sees no other file)
    REQS_DIR="$(mktemp -d)"
    trap 'rm -rf "$REQS_DIR"' EXIT
    REQS="$REQS_DIR/wheelhouse-requirements.txt"
    INSTALL_FROM=(--no-index --require-hashes -r "$REQS")
    export PIP_CONFIG_FILE=/dev/null   # the wheelhouse alone: no index, find-links or constraints from pip.conf
else
    [ -f "$SOURCE/pyproject.toml" ] || die "no teye source tree at $SOURCE (pyproject.toml missing); use --source"
    FILES="$SOURCE/deploy"
    INSTALL_FROM=("$SOURCE")
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3.9 or newer (apt-get install python3 python3-venv)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || die "$PYTHON is older than 3.9"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$PYTHON cannot create virtual environments (Debian/Ubuntu: apt-get install python3-venv)"

# A wheelhouse is for one platform and Python: say which and stop before anything is changed.
if [ -n "$WHEELHOUSE" ]; then
    "$PYTHON" - "$WHEELHOUSE" "$REQS" <<'PY' || die "refusing $WHEELHOUSE: nothing was changed"
import hashlib, json, os, pathlib, platform, re, stat, sys
d, reqs = sys.argv[1], sys.argv[2]
m = json.load(open(os.path.join(d, "teye-wheelhouse.json")))
impl = sys.implementation.name
here = "%s%d%d" % ({"cpython": "cp"}.get(impl, impl), *sys.version_info[:2])
libc, ver = platform.libc_ver()
def vt(v):
    return tuple(int(x) for x in v.split(".") if x.isdigit())
problems = []
if m["python"] != here:
    problems.append("it was built for %s %s (%s), and %s is %s %d.%d (%s)" % (
        m["implementation"], m["python_version"], m["python"], sys.executable, impl, sys.version_info[0],
        sys.version_info[1], here))
if m["machine"] != platform.machine():
    problems.append("it was built for %s machines, and this one is %s" % (m["machine"], platform.machine()))
if m.get("glibc") and (libc != "glibc" or vt(ver) < vt(m["glibc"])):
    problems.append("it needs glibc %s or newer, and this host has %s" % (m["glibc"], ("glibc " + ver) if libc == "glibc" else "no glibc"))
WHEEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")
listed = {}
for name, digest in sorted(m["wheels"].items()):
    if not WHEEL.fullmatch(name) or ".." in name:
        problems.append("its manifest lists %r, which is not a wheel file name in wheels/ (no '/', no '..')" % name)
        continue
    if not re.fullmatch(r"[0-9a-f]{64}", str(digest)):
        problems.append("its manifest gives wheels/%s no sha256 (%r)" % (name, digest))
        continue
    path = os.path.join(d, "wheels", name)
    if os.path.islink(path):
        problems.append("wheels/%s is a symbolic link" % name)
        continue
    listed[name] = digest
    try:
        with open(path, "rb") as fh:
            ok = hashlib.sha256(fh.read()).hexdigest() == digest
    except OSError:
        problems.append("wheels/%s is missing" % name)
        continue
    if not ok:
        problems.append("wheels/%s is damaged (its sha256 differs from teye-wheelhouse.json)" % name)
try:
    present = sorted(os.listdir(os.path.join(d, "wheels")))
except OSError as e:
    present = []
    problems.append("wheels/ cannot be read: %s" % (e.strerror or e))
for name in present:
    if name not in m["wheels"]:
        problems.append("wheels/%s is not listed in teye-wheelhouse.json (a wheelhouse holds its manifest and "
                        "nothing else)" % name)
if not problems:
    with open(reqs, "w") as fh:
        for name, digest in sorted(listed.items()):
            uri = pathlib.Path(os.path.join(d, "wheels", name)).as_uri()
            fh.write("%s --hash=sha256:%s\n" % (uri, digest))
for p in problems:
    sys.stderr.write("teye-install: error: this wheelhouse does not fit this host: %s\n" % p)
if problems:
    sys.stderr.write("teye-install: build a wheelhouse on a machine like this one (./dev.sh dist), or pass "
                     "--python with the interpreter it was built for\n")
sys.exit(1 if problems else 0)
PY
    say "wheelhouse $WHEELHOUSE fits this host (teye $("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["teye"])' "$WHEELHOUSE/teye-wheelhouse.json"))"
fi

HAVE_NVIDIA=0
if [ -e "$NVIDIA_DRIVER_FILE" ]; then
    HAVE_NVIDIA=1
else
    say "no NVIDIA driver found ($NVIDIA_DRIVER_FILE missing): installing the agent for host metrics; the GPU collector reports itself absent (teye_collector_absent, no alert) until a driver is installed"
fi

# 1. user
if [ "$MANAGE_USER" = 1 ]; then
    if getent passwd "$SERVICE_USER" >/dev/null 2>&1; then
        say "user $SERVICE_USER exists"
    else
        run useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin --comment "teye monitoring agent" "$SERVICE_USER"
        say "created system user $SERVICE_USER"
    fi
fi

# 2. venv + package (pip upgrades in place, so re-running upgrades teye).
# teye is always built in an isolated build environment (pip fetches the setuptools that
# pyproject.toml asks for): never with the build tools of this host's Python, which may lack
# `wheel` or carry a setuptools too old for the project metadata.
unset PIP_NO_BUILD_ISOLATION PIP_BUILD_ISOLATION PIP_NO_USE_PEP517 PIP_USE_PEP517
NEW_VENV=0
if [ -x "$VENV/bin/python" ]; then
    say "reusing venv $VENV"
else
    run mkdir -p "$PREFIX"
    run "$PYTHON" -m venv ${VENV_ARGS[@]+"${VENV_ARGS[@]}"} "$VENV"
    NEW_VENV=1
    say "created venv $VENV"
fi
# a failed install leaves no half-made venv behind (an existing one is upgraded in place by pip)
undo_venv() {
    if [ "$NEW_VENV" = 1 ]; then rm -rf "$VENV"; rmdir "$PREFIX" 2>/dev/null || true; fi
    die "$1"
}
if [ -n "$WHEELHOUSE" ] && [ "$DRY_RUN" = 0 ]; then
    # pip's own platform-tag check, before it installs anything (pip >= 22.2 has --dry-run)
    if "$VENV/bin/python" -m pip install --help 2>/dev/null | grep -q -- --dry-run; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run --upgrade \
            "${INSTALL_FROM[@]}" >/dev/null \
            || undo_venv "pip finds no installable teye in $WHEELHOUSE for this Python and platform; nothing was changed"
    fi
fi
if [ "$DRY_RUN" = 1 ]; then
    run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "${INSTALL_FROM[@]}"
else
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "${INSTALL_FROM[@]}" \
        || undo_venv "pip could not install teye into $VENV"
fi
say "installed teye from ${WHEELHOUSE:-$SOURCE} into $VENV"

# 3. configuration (never overwrite the admin's file)
run mkdir -p "$ETC"
if [ -e "$CONFIG" ]; then
    run install -m 0644 "$FILES/teye.example.yml" "$CONFIG.example"
    say "kept existing $CONFIG (the current example is in $CONFIG.example)"
else
    run install -m 0644 "$FILES/teye.example.yml" "$CONFIG"
    # the config keeps the built-in collector defaults, as the example and the DaemonSet do: hardware the
    # node lacks (GPU, PMU, InfiniBand) is reported absent, not failing, so nothing is turned off here
    say "wrote $CONFIG"
fi
if [ "$DRY_RUN" = 0 ]; then
    "$TEYE_BIN" agent --help >/dev/null || die "the installed teye does not run: $TEYE_BIN"
    # Validate the configuration now rather than at service start.
    # (teye's packages live in the launcher's private directory: teye.isolate() puts it on sys.path)
    "$VENV/bin/python" -I -c 'import sys, teye; teye.isolate(); from agent.config import load; load(sys.argv[1])' "$CONFIG" \
        || die "$CONFIG is not a valid teye configuration"
fi

# 4. systemd unit (paths rewritten when installed elsewhere than /opt/teye, /etc/teye)
run mkdir -p "$UNIT_DIR"
if [ "$DRY_RUN" = 1 ]; then
    say "would write $UNIT (ExecStart=$TEYE_BIN agent --config $CONFIG)"
else
    tmp="$(mktemp)"
    sed -e "s|^ExecStart=.*|ExecStart=$TEYE_BIN agent --config $CONFIG|" \
        "$FILES/systemd/teye-agent.service" > "$tmp"
    if [ -e "$UNIT" ] && cmp -s "$tmp" "$UNIT"; then
        rm -f "$tmp"
        say "$UNIT is up to date"
    else
        install -m 0644 "$tmp" "$UNIT"
        rm -f "$tmp"
        say "installed $UNIT"
    fi
fi

# 5. the zero-code phase directory: it runs inside every user's Python process, so it is root-owned,
# read-only and byte-compiled (users cannot write __pycache__ there); replaced whole, never edited in place.
SITE="$PREFIX/site"
if [ "$DRY_RUN" = 1 ]; then
    say "would install $SITE (sitecustomize.py + teye_client) for zero-code phases"
else
    # copied from the teye_client just installed (the same files whether from source or a wheelhouse)
    CLIENT="$("$VENV/bin/python" -I -c 'import os, teye_client; print(os.path.dirname(teye_client.__file__))')" \
        || die "the installed teye has no teye_client"
    rm -rf "$SITE.new"
    mkdir -p "$SITE.new/teye_client"
    install -m 0644 "$CLIENT/_site/sitecustomize.py" "$SITE.new/sitecustomize.py"
    for f in "$CLIENT"/*.py; do install -m 0644 "$f" "$SITE.new/teye_client/"; done
    "$VENV/bin/python" -m compileall -q "$SITE.new" >/dev/null || die "cannot byte-compile $SITE.new"
    chmod -R go-w "$SITE.new"
    chmod 0755 "$SITE.new" "$SITE.new/teye_client"
    rm -rf "$SITE.old"
    if [ -d "$SITE" ]; then mv "$SITE" "$SITE.old"; fi
    mv "$SITE.new" "$SITE"
    rm -rf "$SITE.old"
    say "installed $SITE: zero-code phases for jobs with PYTHONPATH=$SITE (deploy/slurm/README.md)"
fi

if [ "$USE_SYSTEMD" = yes ]; then
    run systemctl daemon-reload
    run systemctl enable "$UNIT_NAME"
    run systemctl restart "$UNIT_NAME"
    say "teye-agent is running: systemctl status $UNIT_NAME; metrics on http://$(hostname -f 2>/dev/null || hostname):9835/metrics"
else
    say "start the agent by hand: $TEYE_BIN agent --config $CONFIG"
fi
say "done"
