#!/usr/bin/env bash
# Install the teye agent on a GPU node as a systemd service.
#
#   sudo deploy/install.sh               # install or upgrade (idempotent)
#   sudo deploy/install.sh --uninstall   # remove the service, venv and user (keeps /etc/teye)
#   sudo deploy/install.sh --uninstall --purge   # ... and /etc/teye
#   deploy/install.sh --dry-run          # print what would be done, change nothing
#
# What it does:
#   1. creates the system user "teye" (no login, no home);
#   2. creates a Python venv under /opt/teye/venv and installs teye from this repository;
#   3. writes /etc/teye/teye.yml from deploy/teye.example.yml when absent (an existing
#      config is never overwritten; the new example goes to teye.yml.example);
#   4. installs deploy/systemd/teye-agent.service to /etc/systemd/system, then
#      daemon-reload, enable --now (restart when it was already running);
#   5. installs the zero-code phase directory at /opt/teye/site (sitecustomize.py and the
#      teye_client package, root-owned, read-only, byte-compiled): a Slurm TaskProlog or a pod
#      puts it first on PYTHONPATH (deploy/slurm/, docs/zero-code.md).
# Without systemd it installs everything else and prints how to start the agent by hand;
# without an NVIDIA driver it disables the GPU collector in a new config and says so.
#
# Options (mostly for packaging and tests):
#   --prefix DIR      venv location parent (default /opt/teye)
#   --etc DIR         config directory (default /etc/teye)
#   --unit-dir DIR    systemd unit directory (default /etc/systemd/system)
#   --source DIR      teye source tree to install (default: this repository)
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
[ -f "$SOURCE/pyproject.toml" ] || die "no teye source tree at $SOURCE (pyproject.toml missing); use --source"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3.9 or newer (apt-get install python3 python3-venv)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || die "$PYTHON is older than 3.9"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$PYTHON cannot create virtual environments (Debian/Ubuntu: apt-get install python3-venv)"

HAVE_NVIDIA=0
if [ -e "$NVIDIA_DRIVER_FILE" ]; then
    HAVE_NVIDIA=1
else
    say "no NVIDIA driver found ($NVIDIA_DRIVER_FILE missing): installing the agent for host metrics; the GPU collector is disabled in a new config"
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
if [ -x "$VENV/bin/python" ]; then
    say "reusing venv $VENV"
else
    run mkdir -p "$PREFIX"
    run "$PYTHON" -m venv ${VENV_ARGS[@]+"${VENV_ARGS[@]}"} "$VENV"
    say "created venv $VENV"
fi
run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$SOURCE"
say "installed teye from $SOURCE into $VENV"

# 3. configuration (never overwrite the admin's file)
run mkdir -p "$ETC"
if [ -e "$CONFIG" ]; then
    run install -m 0644 "$SOURCE/deploy/teye.example.yml" "$CONFIG.example"
    say "kept existing $CONFIG (the current example is in $CONFIG.example)"
else
    run install -m 0644 "$SOURCE/deploy/teye.example.yml" "$CONFIG"
    if [ "$HAVE_NVIDIA" = 0 ]; then
        # collectors.gpu.enabled: true -> false (the two-space indented "gpu:" is under collectors)
        run sed -i -e '/^  gpu:$/,/enabled:/ s/enabled: true/enabled: false/' "$CONFIG"
    fi
    say "wrote $CONFIG"
fi
if [ "$DRY_RUN" = 0 ]; then
    "$TEYE_BIN" agent --help >/dev/null || die "the installed teye does not run: $TEYE_BIN"
    # Validate the configuration now rather than at service start.
    "$VENV/bin/python" -c 'import sys; from agent.config import load; load(sys.argv[1])' "$CONFIG" \
        || die "$CONFIG is not a valid teye configuration"
fi

# 4. systemd unit (paths rewritten when installed elsewhere than /opt/teye, /etc/teye)
run mkdir -p "$UNIT_DIR"
if [ "$DRY_RUN" = 1 ]; then
    say "would write $UNIT (ExecStart=$TEYE_BIN agent --config $CONFIG)"
else
    tmp="$(mktemp)"
    sed -e "s|^ExecStart=.*|ExecStart=$TEYE_BIN agent --config $CONFIG|" \
        "$SOURCE/deploy/systemd/teye-agent.service" > "$tmp"
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
    rm -rf "$SITE.new"
    mkdir -p "$SITE.new/teye_client"
    install -m 0644 "$SOURCE/teye_client/_site/sitecustomize.py" "$SITE.new/sitecustomize.py"
    for f in "$SOURCE"/teye_client/*.py; do install -m 0644 "$f" "$SITE.new/teye_client/"; done
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
