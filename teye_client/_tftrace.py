"""`teye trace` for TensorFlow (issue 46): the TensorFlow profiler over the traced steps, and what it recorded
turned into a Chrome trace that ``teye trace summarize`` reads.

Standard library only, besides the TensorFlow the job has loaded (its profiler, and the protobuf class of the
XSpace it writes).  Imported only when a request is taken.

- ``tf.profiler.experimental.start`` at the step before the warm-up step, into a private temporary directory
  (``mkdtemp``: 0700, the job's own); a profiler already running in the job (its own) makes ``start`` raise,
  and the trace fails with that reason, the job going on.
- Each traced step is marked the way the TensorFlow profiler's own guide marks steps
  (``tf.profiler.experimental.Trace("ProfilerStep", step_num=N, _r=1)``, N from 1, as ``torch.profiler``
  numbers the steps it records after one warm-up): TensorBoard's profile plugin and xprof group the steps by
  those markers.  A marker spans one loop iteration, from one step function's return to the next's, on the
  training thread.  (A TraceMe name cannot hold ``#``: TensorFlow reads ``name#key=value#`` as metadata.)
  The conversion names each root event with a step number (``_r`` 1, ``step_num`` N) ``ProfilerStep#N``,
  as PyTorch names its steps, which is what teye's summary finds.
- At the next boundary ``stop`` writes the XSpace (``*.xplane.pb``); ``export`` converts its host plane to a
  Chrome trace (one thread per XLine, one complete event per XEvent, its stats as args) and hands the XSpace
  itself back, kept beside the trace for TensorBoard or xprof.  Device planes (a GPU's streams) are not
  converted: their names are listed in the trace's ``teye`` record (docs/trace.md).
"""
import glob
import json
import os
import shutil
import tempfile

SUFFIX = ".tf.trace.json"
RAW_SUFFIX = ".xplane.pb"
# where TensorFlow keeps the XSpace's protobuf class (it moved between versions)
XPLANE_MODULES = ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "tsl.profiler.protobuf.xplane_pb2",
                  "tensorflow.core.profiler.protobuf.xplane_pb2")
HOST_PLANE = "/host:"
DATA_LINE = "tf_data"       # tf.data's own threads (producers beside the training): not the step's host ops
STEP_MARK = "ProfilerStep"
STEP_NAME = "ProfilerStep#%d"


class TfProfile:
    """The TensorFlow profiler for ``steps`` steps after one warm-up step (TorchProfile's interface)."""

    SUFFIX = SUFFIX

    def __init__(self, tf, steps):
        self.tf = tf
        self.steps = steps
        self.n = 0
        self.mark = None
        self.running = False
        self.logdir = tempfile.mkdtemp(prefix="teye-tf-trace.")
        try:
            tf.profiler.experimental.start(self.logdir)
        except BaseException:
            self.close()
            raise
        self.running = True

    def step(self):
        """A step ended: its marker closed, the next one opened; True once the steps asked for are recorded."""
        self._unmark()
        if self.n >= self.steps:
            return True
        self.n += 1
        self.mark = self.tf.profiler.experimental.Trace(STEP_MARK, step_num=self.n, _r=1)
        return False

    def _unmark(self):
        mark, self.mark = self.mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def stop(self):
        self._unmark()
        if self.running:
            self.running = False
            self.tf.profiler.experimental.stop()   # (writes the XSpace into logdir)

    def export(self, path, bound):
        """Write the Chrome trace to ``path``; the XSpace file (still in the private directory) is returned as
        ``{RAW_SUFFIX: file}`` for the caller to keep beside it.  ValueError for an XSpace over ``bound``
        bytes (not read) or none written."""
        found = glob.glob(os.path.join(self.logdir, "**", "*" + RAW_SUFFIX), recursive=True)
        if len(found) != 1:
            raise ValueError("the TensorFlow profiler wrote %d XSpace files, not one" % len(found))
        size = os.stat(found[0]).st_size
        if size > bound:
            raise ValueError("the profiler's XSpace is %d bytes, over the request's bound of %d (trace fewer "
                             "steps, or give a larger --max-bytes)" % (size, bound))
        with open(found[0], "rb") as f:
            raw = f.read()
        doc = to_chrome(parse_xspace(raw))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        return {RAW_SUFFIX: found[0]}

    def close(self):
        """Remove the private directory (whatever is left in it)."""
        shutil.rmtree(self.logdir, ignore_errors=True)


def xplane_class():
    """TensorFlow's XSpace protobuf class, from the first of XPLANE_MODULES that imports (ImportError if none)."""
    import importlib
    errors = []
    for name in XPLANE_MODULES:
        try:
            return importlib.import_module(name).XSpace
        except ImportError as e:
            errors.append(str(e))
    raise ImportError("no XSpace protobuf class in this TensorFlow (%s)" % "; ".join(errors))


def parse_xspace(raw, cls=None):
    space = (cls or xplane_class())()
    space.ParseFromString(raw)
    return space


def _value(stat, names):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(stat, kind)
    if kind == "ref_value":      # a string kept once in the plane's stat metadata
        return names.get(v)
    if kind == "bytes_value":
        return None              # (serialized protos: not for a viewer)
    return v


def to_chrome(space):
    """A Chrome trace (dict) of the XSpace's host planes: one process per plane, one thread per line, one
    complete event per event (microseconds from the profile's start), stats as args."""
    out = []
    base_ns = None
    skipped = []
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for s in plane.stats:
            if stat_names.get(s.metadata_id) == "profile_start_time":
                base_ns = _value(s, {})
    for pid, plane in enumerate(space.planes, 1):
        if not plane.name.startswith(HOST_PLANE):
            if plane.lines:
                skipped.append(plane.name)
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        names = {k: v.name or v.display_name for k, v in plane.event_metadata.items()}
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": plane.name}})
        for tid, line in enumerate(plane.lines, 1):
            cat = "tf_data" if line.name.startswith(DATA_LINE) else "cpu_op"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": line.display_name or line.name}})
            start_ps = line.timestamp_ns * 1000
            for e in line.events:
                ev = {"ph": "X", "cat": cat, "name": names.get(e.metadata_id, "?"), "pid": pid, "tid": tid,
                      "ts": (start_ps + e.offset_ps) / 1e6, "dur": e.duration_ps / 1e6}
                if e.stats:
                    args = {}
                    for s in e.stats:
                        v = _value(s, stat_names)
                        if v is not None:
                            args[stat_names.get(s.metadata_id, str(s.metadata_id))] = v
                    if args:
                        ev["args"] = args
                        n = args.get("step_num")
                        if args.get("_r") == 1 and type(n) is int:   # a step marker (xprof's root event)
                            ev["name"] = STEP_NAME % n
                out.append(ev)
    doc = {"traceEvents": out, "displayTimeUnit": "ms",
           "teye": {"framework": "tensorflow", "device_planes_not_converted": skipped}}
    if isinstance(base_ns, int):
        doc["baseTimeNanoseconds"] = base_ns
    return doc
