"""The kernel and the distribution: ``teye_uname_info`` and ``teye_os_info`` (node_exporter's ``uname`` and
``os`` collectors), so a dashboard or a report can tell which nodes run which kernel and release.

uname comes from the uname(2) system call (the node's own when the agent shares the host's UTS
namespace, as the DaemonSet does) and ``<procfs>/sys/kernel/domainname``; the release from
``<rootfs>/etc/os-release``, else ``<rootfs>/usr/lib/os-release`` (os-release(5)).  Each label value is cut
to 256 characters, and os-release is read to at most 64 KiB: an admin-owned file, but a file all the same.
``teye_os_version`` is VERSION_ID as a number; SELinux's state (node_exporter's ``selinux``) comes from
``<sysfs>/fs/selinux/enforce`` and ``<rootfs>/etc/selinux/config``: a host without SELinux reads
``teye_selinux_enabled 0``, not an error.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

from ..errors import ParseError
from ..logutil import RateLimitedLog
from ..metrics import GAUGE, Point, metric, point
from ._files import read_text, under

log = RateLimitedLog(logging.getLogger("teye.os"))

UNAME_LABELS = ("sysname", "release", "version", "machine", "nodename", "domainname")
OS_KEYS = (("ID", "id"), ("ID_LIKE", "id_like"), ("NAME", "name"), ("PRETTY_NAME", "pretty_name"),
           ("VERSION", "version"), ("VERSION_ID", "version_id"), ("VERSION_CODENAME", "version_codename"),
           ("BUILD_ID", "build_id"), ("IMAGE_ID", "image_id"), ("IMAGE_VERSION", "image_version"),
           ("VARIANT", "variant"), ("VARIANT_ID", "variant_id"))
UNAME = metric("teye_uname_info", GAUGE, "1, labelled with the kernel's uname(2) fields and the NIS domain name "
               "(node_uname_info).", UNAME_LABELS)
OS = metric("teye_os_info", GAUGE, "1, labelled with the distribution's os-release(5) fields (node_os_info).",
            tuple(lb for _, lb in OS_KEYS))
OS_VERSION = metric("teye_os_version", GAUGE, "The distribution's version as a number: the major.minor start of "
                    "os-release's VERSION_ID (22.04, 12); absent when it has none (node_os_version).",
                    ("id", "id_like", "name"))
SELINUX_ENABLED = metric("teye_selinux_enabled", GAUGE, "1 when SELinux is enabled (selinuxfs at "
                         "/sys/fs/selinux), 0 when not (node_selinux_enabled); the two modes are absent then.")
SELINUX_CONFIG = metric("teye_selinux_config_mode", GAUGE, "SELinux mode configured for boot in "
                        "<rootfs>/etc/selinux/config: -1 disabled, 0 permissive, 1 enforcing "
                        "(node_selinux_config_mode).")
SELINUX_CURRENT = metric("teye_selinux_current_mode", GAUGE, "SELinux mode now (/sys/fs/selinux/enforce): 0 "
                         "permissive, 1 enforcing (node_selinux_current_mode).")
MAX_LABEL = 256
_VERSION = re.compile(r"^[0-9]+\.?[0-9]*")
_MODES = {"enforcing": 1, "permissive": 0, "disabled": -1}


def os_version(release: Dict[str, str]) -> Optional[float]:
    """VERSION_ID's leading major.minor as a number (None without one)."""
    m = _VERSION.match(release.get("VERSION_ID", ""))
    if m is None:
        return None
    v = float(m.group(0).rstrip("."))
    return v if v > 0 else None


def parse_selinux_config(text: str, path: str = "selinux/config") -> Optional[int]:
    """SELINUX= of /etc/selinux/config as a mode (-1, 0, 1); None when the file sets none."""
    mode = None
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "SELINUX":
            value = value.strip().strip('"').lower()
            if value not in _MODES:
                raise ParseError(path, f"SELINUX={value[:40]!r}: expected enforcing, permissive or disabled")
            mode = _MODES[value]
    return mode
MAX_OS_RELEASE = 64 * 1024


def parse_os_release(text: str, path: str = "os-release") -> Dict[str, str]:
    """KEY=value lines, values shell-quoted or bare (os-release(5)); comments and blank lines skipped."""
    out: Dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise ParseError(path, f"line {lineno}: expected KEY=value, got {line[:80]!r}")
        try:
            words = shlex.split(value)
        except ValueError as e:
            raise ParseError(path, f"line {lineno}: {key}: {e}") from None
        out[key] = " ".join(words)[:MAX_LABEL]
    return out


@dataclass(frozen=True)
class OsReading:
    uname: Dict[str, str]
    release: Optional[Dict[str, str]]  # None: no os-release file
    # (enabled, configured mode, current mode); None when not read
    selinux: Optional[Tuple[bool, Optional[int], Optional[int]]] = None

    def points(self) -> Iterator[Point]:
        yield point(UNAME, 1, *(self.uname.get(k, "") for k in UNAME_LABELS))
        if self.release is not None:
            yield point(OS, 1, *(self.release.get(k, "") for k, _ in OS_KEYS))
            v = os_version(self.release)
            if v is not None:
                yield point(OS_VERSION, v, self.release.get("ID", ""), self.release.get("ID_LIKE", ""),
                            self.release.get("NAME", ""))
        if self.selinux is not None:
            enabled, config, current = self.selinux
            yield point(SELINUX_ENABLED, 1 if enabled else 0)
            if enabled:
                yield point(SELINUX_CONFIG, config)   # None: absent
                yield point(SELINUX_CURRENT, current)


class OsInfoSource:
    name = "os"

    def __init__(self, procfs: str = "/proc", rootfs: str = "/", uname: Callable = os.uname, sysfs: str = "/sys"):
        self.domainname = under(procfs, "sys", "kernel", "domainname")
        self.enforce = under(sysfs, "fs", "selinux", "enforce")
        self.selinux_config = os.path.join(rootfs, "etc", "selinux", "config")
        self.release_paths = [os.path.join(rootfs, p) for p in ("etc/os-release", "usr/lib/os-release")]
        self._uname = uname

    def _release(self) -> Optional[Dict[str, str]]:
        for path in self.release_paths:
            try:
                with open(path, "rb") as fh:
                    data = fh.read(MAX_OS_RELEASE + 1)
            except FileNotFoundError:
                continue
            if len(data) > MAX_OS_RELEASE:
                raise ParseError(path, f"larger than {MAX_OS_RELEASE} bytes: not an os-release file")
            return parse_os_release(data.decode("utf-8", "replace"), path)
        return None

    def collect(self) -> OsReading:
        u = self._uname()
        uname = {"sysname": u.sysname, "release": u.release, "version": u.version, "machine": u.machine,
                 "nodename": u.nodename}
        try:
            uname["domainname"] = read_text(self.domainname).strip()
        except (FileNotFoundError, ParseError):
            uname["domainname"] = ""
        return OsReading({k: v[:MAX_LABEL] for k, v in uname.items()}, self._release(), self._selinux())

    def _selinux(self) -> Optional[Tuple[bool, Optional[int], Optional[int]]]:
        """SELinux's state: not enabled where selinuxfs has no ``enforce`` (a host without SELinux, or
        selinuxfs not mounted); a garbled file leaves that mode absent, named in the log."""
        try:
            current = read_text(self.enforce, limit=64).strip()
        except FileNotFoundError:
            return (False, None, None)
        except (ParseError, OSError) as e:
            log.warning(self.enforce, "os: %s (SELinux state left out)", e)
            return None
        if current not in ("0", "1"):
            log.warning(self.enforce, "os: %s: expected 0 or 1, got %r (current mode left out)", self.enforce,
                        current[:20])
            cur: Optional[int] = None
        else:
            cur = int(current)
        try:
            config = parse_selinux_config(read_text(self.selinux_config, allow_empty=True, limit=1 << 16),
                                          self.selinux_config)
        except FileNotFoundError:
            config = None
        except (ParseError, OSError) as e:
            log.warning(self.selinux_config, "os: %s (configured mode left out)", e)
            config = None
        return (True, config, cur)


def from_config(cfg, ctx=None) -> OsInfoSource:
    return OsInfoSource(cfg["procfs"], cfg["rootfs"], sysfs=cfg["sysfs"])
