"""`teye run [--job NAME] -- CMD ARGS...` and `teye run --print-env`: zero-code phases for a command.

The command runs with teye's ``sitecustomize`` directory first on ``PYTHONPATH`` (teye_client/_site,
docs/zero-code.md), so every Python process it starts reports its PyTorch / TensorFlow phases to the
node's agent without a changed line.  teye *replaces* itself with the command (exec): same pid, same
signals, same terminal, and the exit status is the command's own (a shell sees 128+N for signal N).
"""
from __future__ import annotations

import errno
import os
import shlex
import shutil
import socket
import stat
import sys
from typing import Dict, List, Mapping, Optional

ENV_SITE = "TEYE_SITE_DIR"  # overrides the directory (e.g. the root-owned copy deploy/install.sh makes)


def site_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """The directory holding teye's sitecustomize.py."""
    env = os.environ if environ is None else environ
    d = env.get(ENV_SITE)
    if d:
        return os.path.abspath(d)
    import teye_client
    return os.path.join(os.path.dirname(os.path.abspath(teye_client.__file__)), "_site")


def instrumented_env(environ: Mapping[str, str], job: Optional[str] = None,
                     socket_path: Optional[str] = None) -> Dict[str, str]:
    """``environ`` with the zero-code directory first on PYTHONPATH (once), TEYE_AUTO unset to on."""
    env = dict(environ)
    site = site_dir(env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != site]
    env["PYTHONPATH"] = os.pathsep.join([site] + parts)
    if job:
        env["TEYE_TRAIN_JOB"] = job
    if socket_path:
        env["TEYE_PHASE_SOCKET"] = socket_path
    return env


def env_lines(environ: Mapping[str, str], job: Optional[str] = None, socket_path: Optional[str] = None,
              form: str = "shell") -> List[str]:
    """The ``export NAME=value`` lines that turn zero-code phases on.

    ``form="shell"``: each value quoted with ``shlex.quote``, so ``eval "$(teye run --print-env)"`` keeps a
    ``$(...)``, backquotes or spaces in PYTHONPATH literal (a plain value is printed as it is).
    ``form="taskprolog"``: values literal, as a Slurm TaskProlog prints them (slurmstepd takes the rest of
    the line as the value and expands nothing); a value holding a newline would start another line there,
    so it is refused (ValueError naming the variable)."""
    env = instrumented_env(environ, job, socket_path)
    names = ["PYTHONPATH"] + [n for n in ("TEYE_TRAIN_JOB", "TEYE_PHASE_SOCKET") if env.get(n) != environ.get(n)]
    if form == "taskprolog":
        for n in names:
            if "\n" in env[n] or "\r" in env[n]:
                raise ValueError(f"{n} holds a line break: a TaskProlog line cannot carry it literally")
        return [f"export {n}={env[n]}" for n in names]
    return [f"export {n}={shlex.quote(env[n])}" for n in names]


def socket_problem(path: str) -> Optional[str]:
    """Why no agent would receive what is sent to the phase socket ``path``, or None where something holds it
    (a datagram socket bound there: connecting sends nothing)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.connect(path)
        return None
    except OSError as e:
        code = e.errno
    finally:
        s.close()
    if code in (errno.ENOENT, errno.ENOTDIR):
        return "it does not exist"
    if code in (errno.EACCES, errno.EPERM):
        return "this user may not write to it"
    if code == errno.EPROTOTYPE:
        return "it is a stream socket, not the agent's datagram socket"
    if code == errno.ECONNREFUSED:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = 0
        if not stat.S_ISSOCK(mode):
            return "it is not a socket"
        return "no process is bound to it: a file an agent left behind"
    return os.strerror(code) if code else "it cannot be reached"


def warn_if_no_agent(env: Mapping[str, str]) -> Optional[str]:
    """One stderr line, before the command starts, where no agent holds the socket its processes will send to
    (they run as they would without teye, and send nothing anyone records); the line, or None."""
    path = env.get("TEYE_PHASE_SOCKET")
    if not path:
        from teye_client.reporter import socket_choice
        path, refused = socket_choice()
        if refused:
            line = (f"teye: warning: the phase socket {path} is not used: {refused}; the command runs, its "
                    f"phases are not sent (TEYE_PHASE_SOCKET={path} sends there anyway)")
            print(line, file=sys.stderr)
            return line
    why = socket_problem(path)
    if why is None:
        return None
    line = (f"teye: warning: no agent holds the phase socket {path} ({why}): the command runs, "
            f"its phases are not recorded")
    print(line, file=sys.stderr)
    return line


def main(args) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.print_env:
        if cmd:
            print("teye run: --print-env takes no command", file=sys.stderr)
            return 2
        try:
            lines = env_lines(os.environ, args.job, args.socket, form=args.print_env)
        except ValueError as e:
            print(f"teye run: --print-env=taskprolog: {e}", file=sys.stderr)
            return 2
        sys.stdout.write("".join(line + "\n" for line in lines))
        return 0
    if not cmd:
        print("teye run: no command given; usage: teye run [--job NAME] -- CMD ARGS...", file=sys.stderr)
        return 2
    env = instrumented_env(os.environ, args.job, args.socket)
    exe = shutil.which(cmd[0], path=env.get("PATH")) if os.sep not in cmd[0] else cmd[0]
    if exe is None or not os.path.exists(exe):
        print(f"teye run: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    if env.get("TEYE_AUTO", "1").strip().lower() not in ("0", "false", "no", "off"):
        try:
            warn_if_no_agent(env)
        except Exception as e:  # the check is advice: the command runs whatever it finds
            print(f"teye: warning: the phase socket cannot be checked: {type(e).__name__}: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, cmd, env)
    except OSError as e:  # not executable, bad interpreter line ...: a shell's 126
        print(f"teye run: cannot run {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 126
    return 126  # not reached
