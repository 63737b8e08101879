"""The kernel and the distribution: ``teye_uname_info`` and ``teye_os_info`` (node_exporter's ``uname`` and
``os`` collectors), so a dashboard or a report can tell which nodes run which kernel and release.

uname comes from the uname(2) system call (the node's own when the agent shares the host's UTS
namespace, as the DaemonSet does) and ``<procfs>/sys/kernel/domainname``; the release from
``<rootfs>/etc/os-release``, else ``<rootfs>/usr/lib/os-release`` (os-release(5)).  Each label value is cut
to 256 characters, and os-release is read to at most 64 KiB: an admin-owned file, but a file all the same.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional

from ..errors import ParseError
from ..metrics import GAUGE, Point, metric, point
from ._files import read_text, under

UNAME_LABELS = ("sysname", "release", "version", "machine", "nodename", "domainname")
OS_KEYS = (("ID", "id"), ("ID_LIKE", "id_like"), ("NAME", "name"), ("PRETTY_NAME", "pretty_name"),
           ("VERSION", "version"), ("VERSION_ID", "version_id"), ("VERSION_CODENAME", "version_codename"))
UNAME = metric("teye_uname_info", GAUGE, "1, labelled with the kernel's uname(2) fields and the NIS domain name "
               "(node_uname_info).", UNAME_LABELS)
OS = metric("teye_os_info", GAUGE, "1, labelled with the distribution's os-release(5) fields (node_os_info).",
            tuple(lb for _, lb in OS_KEYS))
MAX_LABEL = 256
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

    def points(self) -> Iterator[Point]:
        yield point(UNAME, 1, *(self.uname.get(k, "") for k in UNAME_LABELS))
        if self.release is not None:
            yield point(OS, 1, *(self.release.get(k, "") for k, _ in OS_KEYS))


class OsInfoSource:
    name = "os"

    def __init__(self, procfs: str = "/proc", rootfs: str = "/", uname: Callable = os.uname):
        self.domainname = under(procfs, "sys", "kernel", "domainname")
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
        return OsReading({k: v[:MAX_LABEL] for k, v in uname.items()}, self._release())


def from_config(cfg, ctx=None) -> OsInfoSource:
    return OsInfoSource(cfg["procfs"], cfg["rootfs"])
