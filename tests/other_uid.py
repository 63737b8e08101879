"""What a test that runs a command as another uid (nobody) hands it: copies it may read, not this tree's paths.

The tree may sit in a directory only its owner can enter (root's home is 0700 on Debian): another uid
can open nothing under it, neither a script, nor this tree's packages, nor the virtualenv's interpreter.
`SharedCopies` makes a world-readable directory (0755) and puts there what the command needs: files and
packages copied (hard links where the file system allows and the file is world-readable, real copies
otherwise), and a Python of its own, a virtualenv whose site-packages are a copy of this interpreter's.
Nothing is taken from the host's site-packages.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile

OTHER_READ = stat.S_IROTH
OTHER_EXEC = stat.S_IXOTH


def others_can_reach(path: str) -> bool:
    """Whether a uid that is neither owner nor in the group can open `path` (mode bits; no ACLs here)."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(1, len(parts)):
        d = os.sep.join(parts[:i]) or os.sep
        if not os.stat(d).st_mode & OTHER_EXEC:
            return False
    mode = os.stat(path).st_mode
    need = OTHER_READ | (OTHER_EXEC if stat.S_ISDIR(mode) else 0)
    return mode & need == need


def _link_or_copy(src: str, dst: str) -> str:
    """A hard link when others may read the file anyway (mode is the inode's), a copy made readable otherwise."""
    st = os.stat(src)
    if st.st_mode & OTHER_READ:
        try:
            os.link(src, dst)
            return dst
        except OSError:   # another file system, or links refused: copy
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, stat.S_IMODE(st.st_mode) | OTHER_READ | (OTHER_EXEC if st.st_mode & stat.S_IXUSR else 0))
    return dst


def _ignore_tree_links(directory, names):
    """Leave out what points back into the private tree: editable-install finders and their .pth files,
    and byte-code caches (the other uid compiles nothing into the copy anyway)."""
    return [n for n in names if n.startswith("__editable__") or n == "__pycache__"
            or (n.endswith(".pth") and "teye" in n.lower())]


def base_interpreter() -> str:
    """A Python of this interpreter's version that other users can run (see SharedCopies.python)."""
    ours = getattr(sys, "_base_executable", None) or sys.executable
    system = "/usr/bin/python%d.%d" % sys.version_info[:2]
    for cand in (ours, os.path.realpath(ours), system):
        if os.path.exists(cand) and others_can_reach(cand):
            return cand
    raise RuntimeError(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that other users may run: "
                       f"{ours} is under a private directory and {system} does not exist (install python3."
                       f"{sys.version_info[1]}, or run the tests from a venv of a system Python)")


class SharedCopies:
    """A directory another uid can read, with copies of what a command run as that uid needs."""

    def __init__(self, near: str = sys.prefix):
        # on the file system of `near` where a world-writable temporary directory there allows (hard links)
        dev = os.stat(near).st_dev
        base = next((d for d in ("/var/tmp", "/tmp") if os.path.isdir(d) and os.stat(d).st_dev == dev), "/tmp")
        self.root = tempfile.mkdtemp(prefix="teye-shared-", dir=base)
        os.chmod(self.root, 0o755)
        self._python = None

    def copy(self, path: str, name: str = None) -> str:
        """A copy of a file or a directory tree under the shared directory; its path."""
        dst = os.path.join(self.root, name or os.path.basename(os.path.normpath(path)))
        if os.path.isdir(path):
            shutil.copytree(path, dst, copy_function=_link_or_copy, ignore=_ignore_tree_links, symlinks=True)
            for d, dirs, _ in os.walk(dst):
                os.chmod(d, 0o755)
        else:
            _link_or_copy(path, dst)
        return dst

    def python(self) -> str:
        """An interpreter another uid can run, seeing a copy of this interpreter's site-packages (torch...).

        Its base is this virtualenv's base interpreter where others can run it, else the system's Python of the
        same version (/usr/bin/python3.X: the same ABI, so the copied compiled packages load); a base under a
        private home (pyenv in /root) links its libpython by an absolute path there and cannot be copied."""
        if self._python:
            return self._python
        base = base_interpreter()
        venv = os.path.join(self.root, "venv")
        subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True, capture_output=True, timeout=120)
        py = os.path.join(venv, "bin", "python")
        theirs = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        for src in ours:
            if os.path.isdir(src) and os.path.realpath(src) != os.path.realpath(theirs):
                shutil.copytree(src, theirs, copy_function=_link_or_copy, ignore=_ignore_tree_links,
                                symlinks=True, dirs_exist_ok=True)
        for d, _, _ in os.walk(venv):
            os.chmod(d, 0o755)
        self._python = py
        return py

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)
