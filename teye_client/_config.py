"""What a PyTorch job is configured with, as the zero-code hook sees it (issue 45; docs/zero-code.md).

The hooks of ``teye_client._torch`` hold the job's objects in their hands: each DataLoader iterator as it is
made, every DistributedDataParallel module, each compilation; this module adds public methods of its own:
``DistributedDataParallel.register_comm_hook`` and ``no_sync``, and ``torch.autocast``'s ``__enter__``.  From
them it keeps a small, fixed set of settings (``KEYS``, the agent's ``agent.phases.jobconfig.KEYS``: the
tests hold them equal), each checked for its type and range; anything else is left out, never sent:

- the training DataLoader's ``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor`` and
  ``batch_size`` (public attributes of the loader; the loader whose batches the newest optimizer step
  followed, else the newest iterator made);
- DDP's ``bucket_bytes_cap`` and ``static_graph`` (the module's attributes), its communication hook by
  PyTorch's name for it (a hook of the job's own is ``custom``: its name is the job's), whether ``no_sync()``
  was entered;
- the dtype of the autocast region entered (``torch.get_autocast_dtype``, public since PyTorch 2.4);
- whether torch.compile compiled anything.

Never user data, paths or object reprs: a subclass whose attribute is a property that raises, an object, or
a huge string is left out.  The reporter asks :func:`payload` at each flush (``sys.modules`` lookup: it never
imports this module) and sends the configuration with the process's identity, once per connection and
whenever it changes.  A forked child inherits what its parent saw (the same objects) and sends it with its
own reporter.  Standard library only, Python 3.8+; it never imports torch (it reads what the hooks hand it).
"""
import json
import sys

from ._common import debug, session, wrapper_of

MAX_INT = 1 << 44
COMM_HOOKS = ("allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
              "bf16_compress_wrapper", "powerSGD_hook", "batched_powerSGD_hook", "noop_hook",
              "quantization_pertensor_hook", "quantization_perchannel_hook", "custom")
DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "other")
KEYS = ("loader.num_workers", "loader.pin_memory", "loader.persistent_workers", "loader.prefetch_factor",
        "loader.batch_size", "ddp.bucket_cap_bytes", "ddp.static_graph", "ddp.comm_hook", "ddp.no_sync",
        "autocast.dtype", "torch.compile")
_HOOK_MODULE = "torch.distributed.algorithms.ddp_comm_hooks"
MAX_KEYED = 64

_static = {}          # ddp.*, autocast.dtype, torch.compile
_loader = {}          # the training loader's settings
_keyed = {}           # loader (iterator) number -> its settings, the newest MAX_KEYED
_state = {"dirty": False, "version": 0, "frag": None, "key": None}


def _int(v, lo, hi):
    return v if type(v) is int and lo <= v <= hi else None


def _bool(v):
    return v if type(v) is bool else None


def note(key, value):
    """One setting now (None: leave it out)."""
    if value is None:
        return
    if _static.get(key) != value:
        _static[key] = value
        _state["dirty"] = True


def _read(obj, name):
    """An attribute of the job's object, or None where reading it raises (a property of a subclass)."""
    try:
        return getattr(obj, name, None)
    except Exception as e:  # noqa: BLE001 (the job's own property: left out, never into the job)
        debug("configuration: %s.%s: %s" % (type(obj).__name__, name, type(e).__name__))
        return None


def loader_made(it, loader):
    """A DataLoader iterator made from ``loader``: its settings kept on the iterator until its first batch
    gives it its number (:func:`keyed`; which loader trains is known at the step: :func:`payload`)."""
    cfg = {}
    for key, name, check in (("loader.num_workers", "num_workers", lambda v: _int(v, 0, 4096)),
                             ("loader.pin_memory", "pin_memory", _bool),
                             ("loader.persistent_workers", "persistent_workers", _bool),
                             ("loader.prefetch_factor", "prefetch_factor", lambda v: _int(v, 1, 1 << 16)),
                             ("loader.batch_size", "batch_size", lambda v: _int(v, 1, 1 << 31))):
        v = check(_read(loader, name))
        if v is not None:
            cfg[key] = v
    try:
        it._teye_cfg = cfg
    except (AttributeError, TypeError):   # an iterator that takes no attribute: its settings are not said
        pass


def keyed(key, it):
    """The iterator's first batch: it is loader number ``key`` (Session.loader), with the settings it was made
    with (kept here: the iterator may be gone by the time the reporter asks)."""
    cfg = getattr(it, "_teye_cfg", None)
    if type(cfg) is not dict:
        return
    _keyed[key] = cfg
    if len(_keyed) > MAX_KEYED:
        for k in list(_keyed)[:MAX_KEYED // 2]:
            del _keyed[k]
    _state["key"] = None   # resolve again at the next payload


def ddp_made(module):
    note("ddp.bucket_cap_bytes", _int(_read(module, "bucket_bytes_cap"), 1, MAX_INT))
    note("ddp.static_graph", _bool(_read(module, "static_graph")))


def compiled():
    note("torch.compile", True)


def _hook_name(hook):
    mod = getattr(hook, "__module__", None)
    name = getattr(hook, "__name__", None)
    if type(mod) is str and mod.startswith(_HOOK_MODULE) and type(name) is str and name in COMM_HOOKS:
        return name
    return "custom"


def patch_ddp(cls):
    """``register_comm_hook`` and ``no_sync`` of DistributedDataParallel, noted (results passed through)."""
    done = []
    reg = cls.__dict__.get("register_comm_hook")
    if type(reg) is type(patch_ddp) and not getattr(reg, "_teye", False):
        def register_comm_hook(self, state, hook, *args, **kwargs):
            out = reg(self, state, hook, *args, **kwargs)
            note("ddp.comm_hook", _hook_name(hook))
            return out
        cls.register_comm_hook = wrapper_of(register_comm_hook, reg)
        done.append("register_comm_hook")
    nosync = cls.__dict__.get("no_sync")
    if type(nosync) is type(patch_ddp) and not getattr(nosync, "_teye", False):
        def no_sync(self, *args, **kwargs):
            note("ddp.no_sync", True)
            return nosync(self, *args, **kwargs)
        cls.no_sync = wrapper_of(no_sync, nosync)
        done.append("no_sync")
    return done


def patch_autocast(module):
    """``torch.autocast.__enter__``: the dtype of the region entered (public torch.get_autocast_dtype)."""
    cls = getattr(module, "autocast", None)
    enter = getattr(cls, "__dict__", {}).get("__enter__")
    code = getattr(enter, "__code__", None)
    if code is None or code.co_argcount != 1 or getattr(enter, "_teye", False):
        debug("torch.autocast is not the class teye expects: its dtype is not said")
        return False
    seen = [None]

    def __enter__(self):
        out = enter(self)
        try:
            # torch is half-imported when this module's hook runs: its public functions are looked up here
            torch = sys.modules.get("torch")
            is_on = getattr(torch, "is_autocast_enabled", None)
            dtype_of = getattr(torch, "get_autocast_dtype", None)   # public since PyTorch 2.4
            dev = self.device
            if not callable(is_on) or not callable(dtype_of):
                return out
            if type(dev) is str and is_on(dev):
                dt = dtype_of(dev)
                if dt is not seen[0]:
                    seen[0] = dt
                    name = str(dt).rpartition(".")[2]
                    note("autocast.dtype", name if name in DTYPES else "other")
        except Exception as e:  # noqa: BLE001 (never into the job: its dtype is not said)
            debug("configuration: autocast: %s: %s" % (type(e).__name__, e))
        return out

    cls.__enter__ = wrapper_of(__enter__, enter)
    return True


def _resolve():
    """The training loader's settings: the loader whose batches the newest step followed (Session.train_keys),
    else (no step followed one yet, or a process whose own Reporter keeps the session aside) the newest read."""
    keys = session.train_keys
    k = keys[-1] if keys else None
    if k is not None and k == _state["key"]:
        return
    cfg = _keyed.get(k) if k is not None else None
    if cfg is None:
        if _loader:
            return   # keep the training loader's
        cfg = _keyed[next(reversed(_keyed))] if _keyed else None
    else:
        _state["key"] = k
    if cfg is not None and cfg != _loader:
        _loader.clear()
        _loader.update(cfg)
        _state["dirty"] = True


def payload():
    """(version, the ``,"cfg":{...}`` part of a datagram) of the process's configuration now; (0, None) while
    there is none.  Never raises (the reporter calls it at each flush)."""
    try:
        if _keyed:
            _resolve()
        if _state["dirty"]:
            cfg = dict(_loader)
            cfg.update(_static)
            ordered = {k: cfg[k] for k in KEYS if k in cfg}
            _state["frag"] = ',"cfg":' + json.dumps(ordered, separators=(",", ":")) if ordered else None
            _state["version"] += 1
            _state["dirty"] = False
    except Exception as e:  # noqa: BLE001 (never into the training loop: the configuration is optional)
        debug("configuration: %s: %s" % (type(e).__name__, e))
    return _state["version"], _state["frag"]
