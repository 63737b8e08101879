"""Reference training run: ``python -m workloads.train --model simple_cnn --steps 100 ...``.

A custom training loop (the pattern the TensorFlow profiler guide recommends) that
times every step's phases with ``time.monotonic_ns()`` through one
:class:`workloads.timing.PhaseTimer`:

* ``data_wait``: ``next()`` on the input iterator until the batch is a tensor,
* ``compute``: the train step until its loss is on the host (the result is ready),
* ``host``: the rest (bookkeeping, progress bar).

At the end: one summary line on stdout and, with ``--results FILE``, a JSON record.
Exit status: 0 done, 1 training failed, 2 bad arguments or data, 3 out of memory
(a ``tf.errors.ResourceExhaustedError``).  Nothing is written to ``--results``
unless training finished.  TensorFlow is imported only after the arguments and the
data have been checked (and after ``TF_GPU_THREAD_MODE`` is set).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import time
from typing import List, Optional, Tuple

import numpy as np

from . import data as wdata
from .annotations import JobAnnotations
from .pipelines import PIPELINES, make_batches
from .phases import Reporter
from .timing import PhaseTimer

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_OOM = 3

MODELS = ("simple_cnn", "resnet50", "facenet")  # == workloads.models.MODELS (kept here: no TF import)
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
THREAD_MODES = ("global", "gpu_private", "gpu_shared")
DISTRIBUTE = ("none", "mirrored", "multiworker")
RESULTS_SCHEMA = 1
DEFAULT_LEARNING_RATE = {"simple_cnn": 1e-3, "resnet50": 1e-4, "facenet": 1e-3}


class UsageError(Exception):
    """A problem with the arguments or environment found before training (exit 2)."""


class TrainingFailed(Exception):
    """Training ran but did not produce a valid result (exit 1)."""


# -- arguments --------------------------------------------------------------------------------
def _bounded(cast, minimum, inclusive: bool, what: str):
    """An argparse type: ``cast(text)``, finite and >= (or >) ``minimum``, else an error saying ``what``."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(v) and (v >= minimum if inclusive else v > minimum)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return v
    return parse


_positive_int = _bounded(int, 0, False, "a positive integer")
_non_negative_int = _bounded(int, 0, True, "an integer >= 0")
_non_negative_float = _bounded(float, 0, True, "a finite number >= 0")
_positive_float = _bounded(float, 0, False, "a finite number > 0")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.train",
        description="Train a reference model (simple_cnn, resnet50, facenet) on CIFAR-10 or synthetic "
                    "CIFAR-shaped data, timing every step's data_wait / compute / host phases.")
    p.add_argument("--model", choices=MODELS, default="simple_cnn", help="model to train (default: %(default)s)")
    p.add_argument("--batch-size", type=_positive_int, default=64,
                   help="batch size per replica (GPU, or the CPU); the global batch is this times the "
                        "number of replicas (default: %(default)s)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, help="number of training steps (default: 50)")
    length.add_argument("--epochs", type=_positive_int, help="number of epochs over this worker's shard")
    p.add_argument("--warmup-steps", type=_non_negative_int, default=1,
                   help="first steps left out of the statistics (tracing, pipeline fill; default: %(default)s)")
    p.add_argument("--pipeline", choices=PIPELINES, default="tfdata",
                   help="naive: Python generator, per-sample read/decode/augment, no prefetch; "
                        "tfdata: parallel reads + map(AUTOTUNE) + batch + prefetch (default: %(default)s)")
    p.add_argument("--cache", action="store_true", help="tfdata: cache decoded samples after the first epoch")
    p.add_argument("--io-latency-ms", type=_non_negative_float, default=0.0,
                   help="storage delay added to every sample read, both pipelines (default: %(default)s)")
    p.add_argument("--decode-cost-ms", type=_non_negative_float, default=0.0,
                   help="CPU work added to every sample's decode, both pipelines: a busy loop of this many ms "
                        "(a costly decoder: input slow by host CPU rather than by storage; default: %(default)s)")
    p.add_argument("--no-prefetch", action="store_true", help="tfdata: no prefetch at the end of the pipeline")
    p.add_argument("--no-parallel-map", action="store_true",
                   help="tfdata: run decode and augment maps sequentially (no num_parallel_calls)")
    p.add_argument("--read-parallelism", type=_positive_int, default=16,
                   help="tfdata: reads in flight at once (interleave cycle length; default: %(default)s)")
    p.add_argument("--gpu-thread-mode", choices=THREAD_MODES,
                   help="sets TF_GPU_THREAD_MODE before TensorFlow starts (gpu_private: dedicated "
                        "kernel-launch threads per GPU)")
    p.add_argument("--gpu-thread-count", type=_positive_int,
                   help="sets TF_GPU_THREAD_COUNT (threads per GPU for gpu_private; default 2)")
    p.add_argument("--mixed-precision", choices=PRECISIONS, default="float32",
                   help="Keras dtype policy (default: %(default)s); mixed_float16 adds loss scaling")
    p.add_argument("--xla", action="store_true", help="compile the forward/backward pass with XLA (jit_compile)")
    p.add_argument("--distribute", choices=DISTRIBUTE, default="none",
                   help="none; mirrored (all local GPUs); multiworker (MultiWorkerMirroredStrategy, "
                        "cluster from TF_CONFIG; see python -m workloads.launch)")
    p.add_argument("--data-dir", help="directory with the CIFAR-10 python batches (data_batch_1..5, test_batch); "
                                      "without it, deterministic synthetic CIFAR-shaped data is used")
    p.add_argument("--synthetic-samples", type=_positive_int, default=10000,
                   help="training samples of synthetic data (default: %(default)s)")
    p.add_argument("--learning-rate", type=_positive_float,
                   help="Adam learning rate (default: 1e-4 for resnet50, which diverges early at 1e-3 "
                        "from scratch; 1e-3 otherwise)")
    p.add_argument("--seed", type=int, default=0, help="random seed (weights, data order, synthetic data)")
    p.add_argument("--profile-dir", metavar="DIR",
                   help="trace the steps after the warm-up with the TensorFlow profiler into DIR and add its "
                        "input-pipeline analysis to the results (needs xprof); the warm-up steps are reported to "
                        "teye as job <train-job>-warmup, so teye's verdict covers the profiled steps")
    p.add_argument("--train-job", help="job name for the phase reporter (default: <model>-bs<batch>)")
    p.add_argument("--no-reporter", action="store_true",
                   help="send no phases of its own (under `teye run`, zero-code phases then report the loop: "
                        "a process with its own reporter is that reporter's job alone)")
    p.add_argument("--results", metavar="FILE",
                   help="write a JSON record here when training finishes (multiworker: '{worker}' in the "
                        "name is replaced by the worker index; otherwise non-chief workers add .worker<i>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is shown only on a TTY)")
    p.add_argument("--grafana-url", metavar="URL", default=os.environ.get("TEYE_GRAFANA_URL") or None,
                   help="post job start/end and epoch annotations to this Grafana (chief worker only; needs "
                        "teye[dashboards]; default: $TEYE_GRAFANA_URL)")
    p.add_argument("--grafana-token", metavar="TOKEN", default=os.environ.get("TEYE_GRAFANA_TOKEN", ""),
                   help="Grafana service-account token for --grafana-url (default: $TEYE_GRAFANA_TOKEN)")
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse and cross-check the arguments; argparse exits with status 2 on any error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gpu_thread_count is not None and args.gpu_thread_mode is None:
        parser.error("--gpu-thread-count needs --gpu-thread-mode (gpu_private or gpu_shared)")
    for flag, on in (("--cache", args.cache), ("--no-prefetch", args.no_prefetch),
                     ("--no-parallel-map", args.no_parallel_map)):
        if on and args.pipeline != "tfdata":
            parser.error(f"{flag} applies to --pipeline tfdata only")
    if args.steps is None and args.epochs is None:
        args.steps = 50
    if args.learning_rate is None:
        args.learning_rate = DEFAULT_LEARNING_RATE.get(args.model, 1e-3)
    if not args.train_job:
        args.train_job = f"{args.model}-bs{args.batch_size}"
    return args


def tf_config_cluster(env=None) -> Tuple[int, int]:
    """(number of workers, this worker's index) from TF_CONFIG; UsageError when absent or invalid."""
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG")
    if not raw:
        raise UsageError("--distribute multiworker needs TF_CONFIG (start the workers with "
                         "python -m workloads.launch, or set it as in docs/workloads.md)")
    try:
        cfg = json.loads(raw)
        workers = cfg["cluster"]["worker"]
        task = cfg["task"]
        index = int(task["index"])
        if task.get("type") not in ("worker", "chief") or not isinstance(workers, list) or not workers:
            raise ValueError("task.type must be worker and cluster.worker a non-empty list")
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"TF_CONFIG is not a valid cluster spec ({type(e).__name__}: {e})") from None
    n = len(workers) + len(cfg["cluster"].get("chief", []))
    if not 0 <= index < n:
        raise UsageError(f"TF_CONFIG task index {index} is outside the {n} workers")
    return n, index


def make_sink(args):
    """The phase reporter every timed phase is forwarded to (the teye agent, see docs/phases.md); None
    with --no-reporter."""
    return None if getattr(args, "no_reporter", False) else Reporter(train_job=args.train_job)


# -- data -------------------------------------------------------------------------------------
def load_data(args) -> Tuple[np.ndarray, str, dict]:
    """(training records, one-line description, results fields); DataError on bad files."""
    if args.data_dir:
        (x, y), _ = wdata.load_cifar10(args.data_dir)
        return wdata.encode_records(x, y), f"CIFAR-10 from {args.data_dir} ({len(x)} training images)", {
            "data": "cifar10", "data_dir": os.path.abspath(args.data_dir), "train_samples": int(len(x))}
    (x, y), _ = wdata.synthetic_cifar10(args.synthetic_samples, 0, seed=args.seed)
    return wdata.encode_records(x, y), (
        f"synthetic CIFAR-shaped data ({len(x)} deterministic images, learnable class patterns; "
        f"no --data-dir)"), {"data": "synthetic", "data_dir": None, "train_samples": int(len(x))}


def configure_threads(args, log) -> None:
    """Export TF_GPU_THREAD_MODE/COUNT; they only work before TensorFlow is imported."""
    if args.gpu_thread_mode is None:
        return
    wanted = {"TF_GPU_THREAD_MODE": args.gpu_thread_mode}
    if args.gpu_thread_count is not None:
        wanted["TF_GPU_THREAD_COUNT"] = str(args.gpu_thread_count)
    if "tensorflow" in sys.modules and any(os.environ.get(k) != v for k, v in wanted.items()):
        log("warning: TensorFlow is already imported in this process; --gpu-thread-mode/--gpu-thread-count "
            "take effect only in a fresh process (python -m workloads.train)")
    os.environ.update(wanted)


# -- the training machinery (TensorFlow from here on) -----------------------------------------
def device_info(tf) -> dict:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return {"device_kind": "gpu", "device_name": details.get("device_name", "GPU"), "device_count": len(gpus)}
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"device_kind": "cpu", "device_name": name, "device_count": os.cpu_count() or 1}


class Trainer:
    """Model, optimizer and the compiled train step for one configuration.

    ``batch_size`` is per replica; ``global_batch`` = batch_size x replicas in sync and
    ``local_batch`` = batch_size x replicas on this worker.
    """

    def __init__(self, model_name: str, batch_size: int, *, learning_rate: float = 1e-3,
                 mixed_precision: str = "float32", xla: bool = False, strategy=None, num_workers: int = 1):
        import keras
        import tensorflow as tf

        from . import models

        self.tf = tf
        self.model_name = model_name
        self.strategy = strategy
        self.num_workers = num_workers
        replicas = strategy.num_replicas_in_sync if strategy is not None else 1
        self.replicas = replicas
        self.local_replicas = max(1, replicas // num_workers)
        self.global_batch = batch_size * replicas
        self.local_batch = batch_size * self.local_replicas
        self.batch_size = batch_size
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        with scope:
            self.model = models.build_model(model_name)
            opt = keras.optimizers.Adam(learning_rate)
            if mixed_precision == "mixed_float16":
                opt = keras.optimizers.LossScaleOptimizer(opt)
            opt.build(self.model.trainable_variables)
            self.optimizer = opt
        per_example = models.loss_fn(model_name)
        model, global_batch = self.model, self.global_batch

        def grads_fn(x, y):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = tf.nn.compute_average_loss(per_example(y, out), global_batch_size=global_batch)
                scaled = opt.scale_loss(loss)
            return loss, tape.gradient(scaled, model.trainable_variables)

        if xla:
            grads_fn = tf.function(grads_fn, jit_compile=True)

        def replica_step(x, y):
            loss, grads = grads_fn(x, y)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        def eval_loss(x, y):
            out = model(x, training=True)  # batch statistics: moving BN stats are meaningless this early
            return tf.reduce_mean(per_example(y, out))

        if strategy is None:
            self._step = tf.function(replica_step)
        else:
            sum_ = tf.distribute.ReduceOp.SUM

            @tf.function
            def dist_step(x, y):
                return strategy.reduce(sum_, strategy.run(replica_step, args=(x, y)), axis=None)

            self._step = dist_step
        self._eval = tf.function(eval_loss)

    # -- input --
    def batches(self, kind: str, records: np.ndarray, *, io_latency_ms: float = 0.0, read_parallelism: int = 16,
                cache: bool = False, seed: int = 0, worker_index: int = 0, decode_cost_ms: float = 0.0,
                parallel_map: bool = True, prefetch: bool = True):
        """An iterator of step inputs (tensors / per-replica values) for this worker."""
        strategy = self.strategy
        common = dict(io_latency_ms=io_latency_ms, read_parallelism=read_parallelism, cache=cache, seed=seed,
                      decode_cost_ms=decode_cost_ms, parallel_map=parallel_map, prefetch=prefetch)
        if kind == "tfdata":
            if strategy is None:
                return iter(make_batches("tfdata", records, self.local_batch, **common))

            def dataset_fn(ctx):
                return make_batches("tfdata", records, ctx.get_per_replica_batch_size(self.global_batch),
                                    shard_count=ctx.num_input_pipelines, shard_index=ctx.input_pipeline_id,
                                    **common)

            return iter(strategy.distribute_datasets_from_function(dataset_fn))
        gen = make_batches("naive", records, self.local_batch, shard_count=self.num_workers,
                           shard_index=worker_index, **common)
        return self._naive_to_tensors(gen)

    def _naive_to_tensors(self, gen):
        tf, strategy, k = self.tf, self.strategy, self.local_replicas
        for x, y in gen:
            if strategy is None:
                yield tf.convert_to_tensor(x), tf.convert_to_tensor(y)
                continue
            xs, ys = np.split(x, k), np.split(y, k)

            def value_fn(ctx, xs=xs, ys=ys):
                i = ctx.replica_id_in_sync_group % k
                return tf.convert_to_tensor(xs[i]), tf.convert_to_tensor(ys[i])

            yield strategy.experimental_distribute_values_from_function(value_fn)

    # -- steps --
    def step(self, batch) -> float:
        """One training step; returns the (globally averaged) loss once it is computed."""
        x, y = batch
        return float(self._step(x, y).numpy())

    def loss_on(self, x, y) -> float:
        """Mean loss of the current model on one local batch (no update)."""
        return float(self._eval(self.tf.convert_to_tensor(x), self.tf.convert_to_tensor(y)).numpy())

    def weights_sha256(self) -> str:
        h = hashlib.sha256()
        for v in self.model.weights:
            h.update(np.ascontiguousarray(np.asarray(v.numpy())).tobytes())
        return h.hexdigest()


class Progress:
    """A one-line progress bar on a TTY stream (silent elsewhere)."""

    def __init__(self, total: int, stream=None, enabled: bool = True, width: int = 30):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total = total
        self.width = width
        self._last = 0.0

    def update(self, done: int, loss: float, samples_per_s: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self._last < 0.1:
            return
        self._last = now
        filled = int(self.width * done / max(1, self.total))
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                          f"loss {loss:.4f} {samples_per_s:8.1f} samples/s")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def _make_strategy(tf, kind: str):
    if kind == "none":
        return None
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MultiWorkerMirroredStrategy()


def _results_path(path: str, multiworker: bool, index: int) -> str:
    if "{worker}" in path:
        return path.replace("{worker}", str(index))
    if multiworker and index > 0:
        return f"{path}.worker{index}"
    return path


def _json_safe(v):
    """NaN/inf -> None (strict JSON), recursively."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def _write_json(path: str, record: dict) -> None:
    record = _json_safe(record)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, sort_keys=True, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)


def _mean(xs) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


def train(args, records: np.ndarray, log, *, num_workers: int = 1, worker_index: int = 0,
          timer: Optional[PhaseTimer] = None, notes: Optional[JobAnnotations] = None) -> dict:
    """Run the configured training; returns the results record (raises on failure).

    ``notes`` (optional) gets the start annotation before the first step and one per finished epoch."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)
    previous_policy = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(args.mixed_precision)
    try:
        strategy = _make_strategy(tf, args.distribute)
        trainer = Trainer(args.model, args.batch_size, learning_rate=args.learning_rate,
                          mixed_precision=args.mixed_precision, xla=args.xla, strategy=strategy,
                          num_workers=num_workers)
        n_local = len(range(worker_index, records.shape[0], num_workers))
        if trainer.local_batch > n_local:
            raise UsageError(f"batch of {trainer.local_batch} samples per worker is larger than this worker's "
                             f"{n_local} training samples")
        steps_per_epoch = n_local // trainer.local_batch
        steps = args.steps if args.steps is not None else args.epochs * steps_per_epoch
        initial_sha = trainer.weights_sha256()
        it = trainer.batches(args.pipeline, records, io_latency_ms=args.io_latency_ms,
                             read_parallelism=args.read_parallelism, cache=args.cache, seed=args.seed,
                             worker_index=worker_index, decode_cost_ms=args.decode_cost_ms,
                             parallel_map=not args.no_parallel_map, prefetch=not args.no_prefetch)
        timer = timer if timer is not None else PhaseTimer(sink=make_sink(args))
        progress = Progress(steps, enabled=not args.no_progress)
        losses: List[float] = []
        if notes is not None:
            notes.start(f"{args.train_job} started: {args.model} bs={args.batch_size} pipeline={args.pipeline}, "
                        f"{steps} steps" + (f" ({args.epochs} epochs)" if args.epochs else ""))
        warmup = min(args.warmup_steps, max(0, steps - 1))
        profiling = getattr(args, "profile_dir", None)
        real_sink = timer.sink
        if profiling and warmup and real_sink is not None:  # warm-up under its own name: teye sees the profiled steps
            timer.sink = Reporter(train_job=f"{args.train_job}-warmup")
        t0 = time.monotonic()
        # The loop's own clock, apart from the PhaseTimer timestamps that teye receives: perf_counter
        # right around next() and at each step's end, summed over the measured (post-warm-up) steps.
        # tests/workloads/test_diagnosis_fidelity.py holds teye's input-bound share against it.
        loop_next_s = 0.0
        loop_start = loop_end = None
        loop_first_call_s = 0.0   # without warm-up: the first step's call of its tf.function, which traces it
        for i in range(steps):
            traced = contextlib.nullcontext()
            if profiling and i >= warmup:
                if i == warmup:
                    if timer.sink is not real_sink:
                        timer.sink.close()
                        timer.sink = real_sink
                    tf.profiler.experimental.start(args.profile_dir)
                traced = tf.profiler.experimental.Trace("train", step_num=i, _r=1)
            with traced:
                with timer.phase("data_wait"):
                    w0 = time.perf_counter()
                    batch = next(it)
                    w1 = time.perf_counter()
                if i >= warmup:
                    loop_next_s += w1 - w0
                    if loop_start is None:   # no warm-up: the first step starts at its first phase
                        loop_start = w0
                with timer.phase("compute"):
                    c0 = time.perf_counter()
                    loss = trainer.step(batch)
                    if i == 0 and warmup == 0:
                        loop_first_call_s = time.perf_counter() - c0
                with timer.phase("host"):
                    if not math.isfinite(loss) and args.mixed_precision != "mixed_float16":
                        raise TrainingFailed(f"loss became {loss} at step {i + 1}")
                    losses.append(loss)
                    done = (i + 1) * trainer.global_batch
                    progress.update(i + 1, loss, done / max(1e-9, time.monotonic() - t0))
                timer.step(samples=trainer.local_batch)
                loop_end = time.perf_counter()
                if i == warmup - 1:        # steps are contiguous: the measured ones start here
                    loop_start = loop_end
            if notes is not None and args.epochs and (i + 1) % steps_per_epoch == 0:
                notes.epoch((i + 1) // steps_per_epoch, args.epochs, f"step {i + 1}, loss {loss:.4f}")
        tf_profiler = None
        if profiling:
            tf.profiler.experimental.stop()
            from .tfprofile import ProfilerUnavailable, input_analysis
            try:
                tf_profiler = input_analysis(args.profile_dir)
            except ProfilerUnavailable as e:
                tf_profiler = {"error": str(e)}
        final_sha = trainer.weights_sha256()
        info = device_info(tf)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    summary = timer.summary(warmup_steps=warmup)
    finite = [v for v in losses if math.isfinite(v)]
    k = max(1, len(finite) // 10)
    record = {
        "schema": RESULTS_SCHEMA,
        "model": args.model,
        "batch_size": args.batch_size,
        "global_batch_size": trainer.global_batch,
        "steps": steps,
        "epochs": args.epochs,
        "pipeline": args.pipeline,
        "cache": args.cache,
        "io_latency_ms": args.io_latency_ms,
        "decode_cost_ms": args.decode_cost_ms,
        "prefetch": not args.no_prefetch,
        "parallel_map": not args.no_parallel_map,
        "read_parallelism": args.read_parallelism,
        "gpu_thread_mode": args.gpu_thread_mode or os.environ.get("TF_GPU_THREAD_MODE") or "global",
        "gpu_thread_count": args.gpu_thread_count,
        "mixed_precision": args.mixed_precision,
        "xla": args.xla,
        "distribute": args.distribute,
        "workers": num_workers,
        "worker_index": worker_index,
        "replicas": trainer.replicas,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "train_job": args.train_job,
        "tensorflow_version": tf.__version__,
        "hostname": platform.node(),
        **info,
        **summary.as_dict(),
        # samples/s above counts this worker's samples; the job's rate is about workers x that
        "global_samples_per_s": summary.samples_per_s * num_workers,
        "loss_first": losses[0] if losses else math.nan,
        "loss_last": losses[-1] if losses else math.nan,
        "loss_first_mean": _mean(finite[:k]),
        "loss_last_mean": _mean(finite[-k:]),
        "initial_weights_sha256": initial_sha,
        "weights_sha256": final_sha,
    }
    if loop_start is not None and loop_end is not None and loop_end > loop_start:
        wall = loop_end - loop_start
        record["loop_clock"] = {"steps": steps - warmup, "wall_s": wall, "next_s": loop_next_s,
                                "input_wait_fraction": loop_next_s / wall, "first_call_s": loop_first_call_s,
                                # the share of the steps' time but the first call's (teye's compile phase)
                                "input_wait_fraction_steps": loop_next_s / (wall - loop_first_call_s)}
    if tf_profiler is not None:
        record["tf_profiler"] = tf_profiler
    return record


def summary_line(r: dict, data_desc: str) -> str:
    lat = f" io_latency={r['io_latency_ms']:g}ms" if r["io_latency_ms"] else ""
    lat += f" decode_cost={r['decode_cost_ms']:g}ms" if r.get("decode_cost_ms") else ""
    lat += "" if r.get("prefetch", True) else " -prefetch"
    lat += "" if r.get("parallel_map", True) else " -parallel_map"
    knobs = [f"{r['model']} bs={r['batch_size']}", f"pipeline={r['pipeline']}{' +cache' if r['cache'] else ''}{lat}"]
    if r["mixed_precision"] != "float32":
        knobs.append(r["mixed_precision"])
    if r["xla"]:
        knobs.append("xla")
    if r["gpu_thread_mode"] != "global":
        knobs.append(f"threads={r['gpu_thread_mode']}")
    if r["distribute"] == "multiworker":
        knobs.append(f"multiworker worker {r['worker_index']} of {r['workers']}")
    elif r["distribute"] == "mirrored":
        knobs.append(f"mirrored x{r['replicas']}")
    return (f"{' '.join(knobs)} on {r['device_kind']} ({r['device_name']}), data: {data_desc}: "
            f"{r['samples_per_s']:.1f} samples/s, step p50 {r['step_time_p50_s'] * 1e3:.1f} ms "
            f"p95 {r['step_time_p95_s'] * 1e3:.1f} ms, input wait {r['input_wait_fraction'] * 100:.1f}% of wall time, "
            f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f} ({r['measured_steps']} measured steps "
            f"after {r['warmup_steps']} warm-up)")


def main(argv: Optional[List[str]] = None, *, timer: Optional[PhaseTimer] = None) -> int:
    args = parse_args(argv)  # exits 2 on bad arguments

    def log(msg: str) -> None:
        print(f"workloads.train: {msg}", file=sys.stderr, flush=True)

    try:
        num_workers, worker_index = (tf_config_cluster() if args.distribute == "multiworker" else (1, 0))
        records, data_desc, data_fields = load_data(args)
    except (UsageError, wdata.DataError) as e:
        log(f"error: {e}")
        return EXIT_USAGE
    log(f"using {data_desc}")
    configure_threads(args, log)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    notes = JobAnnotations.from_args(args, worker_index, log)
    try:
        record = train(args, records, log, num_workers=num_workers, worker_index=worker_index, timer=timer,
                       notes=notes)
    except UsageError as e:
        log(f"error: {e}")
        notes.end(f"{args.train_job} failed: {e}")
        return EXIT_USAGE
    except tf.errors.ResourceExhaustedError as e:
        first = e.message.splitlines()[0] if e.message else str(e)
        log(f"out of memory with batch size {args.batch_size} ({first}); no results written")
        notes.end(f"{args.train_job} failed: out of memory with batch size {args.batch_size} ({first})")
        return EXIT_OOM
    except TrainingFailed as e:
        log(f"training failed: {e}; no results written")
        notes.end(f"{args.train_job} failed: {e}")
        return EXIT_FAILED
    except BaseException as e:  # not handled here: close the job's region in Grafana, then let it propagate
        notes.end(f"{args.train_job} crashed: {type(e).__name__}: {e}")
        raise
    record.update(data_fields)
    line = summary_line(record, data_desc)
    print(line, flush=True)
    if args.results:
        path = _results_path(args.results, args.distribute == "multiworker", worker_index)
        _write_json(path, record)
        log(f"results written to {path}")
    notes.end(line)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
