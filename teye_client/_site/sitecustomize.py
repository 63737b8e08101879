"""teye zero-code phases, loaded at interpreter start (docs/zero-code.md).

This directory is put first on PYTHONPATH by `teye run`, a Slurm TaskProlog or a pod's env.
Python imports this file as `sitecustomize` at start; it installs teye's import hook (which
patches PyTorch / TensorFlow only if the program imports them; until its first training step
it opens no socket and starts no thread) and then runs the next `sitecustomize` on the path,
as if this one were not there: whatever that one prints or raises reaches Python's `site`
exactly as it would without teye.  TEYE_AUTO=0 turns teye off; TEYE_DEBUG=1 says on stderr
why it stood aside.  Keep this file to the syntax of old Pythons: it runs in every one.
"""
import os
import sys


def _teye_here():
    return os.path.dirname(os.path.abspath(__file__))


def _teye_say(msg):
    if os.environ.get("TEYE_DEBUG") == "1":
        try:
            sys.stderr.write("teye: zero-code phases off in pid %d: %s\n" % (os.getpid(), msg))
        except Exception:
            pass


def _teye_install(here):
    auto = os.environ.get("TEYE_AUTO", "1")
    if auto.strip().lower() in ("0", "false", "no", "off"):
        _teye_say("TEYE_AUTO=%s" % auto)
        return
    if sys.version_info < (3, 8):
        _teye_say("Python %d.%d (teye needs 3.8 or later)" % sys.version_info[:2])
        return
    try:
        auto = sys.modules.get("teye_client.auto")
        if auto is None:
            # the teye_client package this directory belongs to, not whatever else the path holds: beside
            # this file (deploy/install.sh's copy) or this directory's package (teye_client/_site), without
            # leaving its parent directory (site-packages of another environment) on sys.path
            parent = here
            if not os.path.isfile(os.path.join(here, "teye_client", "__init__.py")):
                parent = os.path.dirname(os.path.dirname(here))
            if "teye_client" not in sys.modules:
                sys.path.insert(0, parent)
                try:
                    import teye_client  # noqa: F401
                finally:
                    try:
                        sys.path.remove(parent)
                    except ValueError:
                        pass
            import teye_client.auto as auto
        auto.install()
    except Exception as e:  # teye must never break a job: stand aside
        _teye_say("%s: %s" % (type(e).__name__, e))


def _teye_chain(here):
    """Import the next sitecustomize on the path (the user's or the distribution's), if any."""
    me = sys.modules.pop("sitecustomize", None)
    kept = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if len(kept) != len(sys.path):
        sys.path[:] = kept  # our directory leaves sys.path (it stays in PYTHONPATH for child processes)
    try:
        import sitecustomize  # noqa: F401  (its exceptions go to site.py, as without teye)
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            raise
        if me is not None:
            sys.modules["sitecustomize"] = me


_teye_dir = _teye_here()
_teye_install(_teye_dir)
_teye_chain(_teye_dir)
