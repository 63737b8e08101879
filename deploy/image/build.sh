#!/usr/bin/env bash
# Build teye's OCI image from Debian packages alone (no registry base image) and a wheelhouse.
#
#   deploy/image/build.sh [--suite SUITE] [--mirror URL] [--tag NAME] [--label K=V] WHEELHOUSE OUT.tar
#
#   1. mmdebstrap makes the root filesystem: Debian's essential set plus python3 and libstdc++6 (grpcio's
#      C++ core needs it) (the suite defaults to this
#      host's release, so its Python is the one the wheelhouse was built with), documentation,
#      man pages and locales left out;
#   2. a venv at /opt/teye/venv gets teye[kubernetes] (grpcio: the kubelet's pod-resources API, for the GPU
#      allocation to pods) from WHEELHOUSE (pip --no-index: the image build needs the Debian archive, never
#      PyPI); pip and the wheels are removed afterwards;
#   3. podman import turns the tarball into an image (entrypoint teye, user 65210, port 9835; the default command
#      reads the host where the README's command and the DaemonSet mount it: /host/proc, /host/sys, the host's /
#      at /host/root (--path.rootfs) and its cgroups at /host/sys/fs/cgroup; OCI labels title,
#      version (the wheelhouse's teye version), licenses and description, one LABEL each) and
#      podman save writes OUT.tar (OCI archive: `podman load -i OUT.tar`, `skopeo copy oci-archive:...`).
# Needs root (or a user namespace) for mmdebstrap, and podman; all Debian packages
# (apt-get install mmdebstrap podman).
set -euo pipefail
SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-stable}")
MIRROR=
TAG=
LABELS=()
ARGS=()
die() { printf 'teye-image: error: %s\n' "$*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) SUITE="${2:?}"; shift ;;
        --mirror) MIRROR="${2:?}"; shift ;;
        --tag) TAG="${2:?}"; shift ;;
        --label) LABELS+=(--change "LABEL ${2:?}"); shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done
[ ${#ARGS[@]} = 2 ] || die "usage: deploy/image/build.sh [--suite SUITE] [--tag NAME] WHEELHOUSE OUT.tar"
WH="$(cd "${ARGS[0]}" && pwd)" || die "no wheelhouse ${ARGS[0]}"
OUT="${ARGS[1]}"
[ -f "$WH/teye-wheelhouse.json" ] || die "$WH is not a teye wheelhouse (build one with ./dev.sh dist)"
# the version is the package's own (its wheel's metadata, as the wheelhouse manifest records it), never written here
VERSION=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["teye"])' "$WH/teye-wheelhouse.json") \
    || die "cannot read the teye version from $WH/teye-wheelhouse.json"
[ -n "$VERSION" ] || die "no teye version in $WH/teye-wheelhouse.json"
TAG=${TAG:-localhost/teye:$VERSION}
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
command -v podman >/dev/null || die "podman is not installed (apt-get install podman)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# 65210: the agent's user in the image (no name needed; the DaemonSet runs it as this uid)
mmdebstrap --variant=essential --include=python3,python3-venv,libstdc++6 --mode=root --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="copy-in $WH /tmp" \
    --customize-hook='chroot "$1" python3 -m venv /opt/teye/venv' \
    --customize-hook="chroot \"\$1\" env PIP_CONFIG_FILE=/dev/null /opt/teye/venv/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check --find-links /tmp/$(basename "$WH")/wheels 'teye[kubernetes]'" \
    --customize-hook='chroot "$1" /opt/teye/venv/bin/pip uninstall --quiet --yes pip setuptools' \
    --customize-hook="rm -rf \"\$1/tmp/$(basename "$WH")\" \"\$1\"/var/cache/apt/* \"\$1\"/var/lib/apt/lists/* \"\$1\"/var/log/*" \
    --customize-hook='mkdir -p "$1/run/teye" "$1/host" && chown 65210:65210 "$1/run/teye"' \
    --customize-hook='chroot "$1" /opt/teye/venv/bin/python -m compileall -q /opt/teye/venv >/dev/null || true' \
    "$SUITE" "$TMP/rootfs.tar" ${MIRROR:+"$MIRROR"} >&2
podman import \
    --change 'ENTRYPOINT ["/opt/teye/venv/bin/teye"]' \
    --change 'CMD ["agent", "--listen=0.0.0.0:9835", "--procfs=/host/proc", "--sysfs=/host/sys", "--path.rootfs=/host/root", "--path.udev.data=/host/root/run/udev/data", "--cgroupfs=/host/sys/fs/cgroup", "--phase-socket=/run/teye/phases.sock"]' \
    --change 'USER 65210:65210' \
    --change 'EXPOSE 9835/tcp' \
    --change 'ENV PATH=/opt/teye/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL org.opencontainers.image.title=teye' \
    --change "LABEL org.opencontainers.image.version=$VERSION" \
    --change 'LABEL org.opencontainers.image.licenses=Apache-2.0' \
    --change 'LABEL org.opencontainers.image.description="teye agent: host, GPU and training-job metrics for Prometheus"' \
    ${LABELS[@]+"${LABELS[@]}"} \
    "$TMP/rootfs.tar" "$TAG" >/dev/null
rm -f "$OUT"
podman save --format oci-archive -o "$OUT" "$TAG" >/dev/null
echo "teye-image: built $TAG ($(du -h "$OUT" | cut -f1) OCI archive at $OUT)"
