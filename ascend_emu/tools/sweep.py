"""Sweeps: many independent replays of one model, serially or on a Dask cluster.

A sweep is one model with its inputs and its float32 reference (a :class:`SweepContext`, shipped to
each worker once) and a list of :class:`ReplayTask` specs (a name, a :class:`~ascend_emu.npu.device.Device`,
where to keep the dump, an optional analysis function): small, picklable, independent. The same code
runs them

- ``scheduler="none"``: one after the other in this process;
- ``scheduler="local"``: on a ``dask.distributed`` LocalCluster of worker processes on this machine
  (one thread each, as many workers as cores unless ``n_workers`` says otherwise);
- ``scheduler="tcp://host:8786"`` (any Dask address): on an existing cluster, unchanged;
- ``scheduler=None``: :func:`default_scheduler`, serial on 1 or 2 cores (a cluster's start costs more than the
  second core gives), local from 3 with Dask.

Each worker keeps what it has loaded (a model file's graph, by path, modification time and size, checked
against the fingerprint) and its compiled kernels across sweeps; a task returns a :class:`TaskResult` (final-output metrics against the reference,
fusion counts, status register, the analysis' small dict), never tensors. A dump asked for is written by the
worker under a hidden staging name beside its destination and renamed into place when complete, so a path
must be shared between the workers and this process (true for a LocalCluster), and an interrupted sweep
(Ctrl-C: pending tasks are cancelled) leaves no half-written dump. A task that fails is retried once; if
it fails again its :class:`TaskResult` carries the error, and :func:`raise_failures` reports it.
Dask is optional (``pip install ascend-emu[dask]``): without it only ``scheduler="none"`` runs.
"""
from __future__ import annotations

import copy
import functools
import math
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import AscendEmuError

#: each metric's column in the comparison (:data:`ascend_emu.analysis.metrics.METRIC_COLUMNS`)
METRIC_COLUMN = {"cosine": "Cosine", "max_rel_err": "MaxRelativeErr", "max_abs_err": "MaxAbsErr", "rmse": "RMSE"}
#: retries of a failed task before it is reported
RETRIES = 1
#: how long to wait for the scheduler of ``tcp://...`` to answer
CONNECT_TIMEOUT = "10s"


def reference_engine(model) -> str:
    """What computes the float32 reference of ``model`` (a loaded Graph or a path): onnxruntime for an ONNX
    model, torch for an exported PyTorch program, else TensorFlow."""
    if getattr(model, "onnx", None) is not None or str(getattr(model, "name", model)).lower().endswith(".onnx"):
        return "onnxruntime"
    if getattr(model, "pt2", None) is not None or str(getattr(model, "name", model)).lower().endswith(".pt2"):
        return "PyTorch"
    return "TensorFlow"


def sweep_device(device=None, device_kwargs=None):
    """The Device a sweep's runs start from: ``device``, or one made from ``device_kwargs`` (which may hold the
    device itself under ``"device"``); both at once is an error."""
    from ..npu.device import Device

    kw = dict(device_kwargs or {})
    if device is None:
        device = kw.pop("device", None)
    if device is None:
        return Device(**kw)
    if kw:
        raise AscendEmuError("pass either device= or Device keyword arguments in device_kwargs, not both")
    return device


def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


#: the fewest cores this process may use for ``scheduler=None`` to mean a LocalCluster. On 2 cores the cluster's
#: start (each worker process imports TensorFlow and loads the model) and the shipping outweigh the second core:
#: ``mixlist-search`` of the demo CNN took 34.7 and 52.5 s on 2 local workers against 8.5 and 13.4 s serially
#: (A/B alternating, load 3-4; session 15: 28.7-36.5 s against 8.6-10.9 s), and 16 MobileNetV2 replays 0.57-1.25x
#: (benchmarks/RESULTS.md); with one core its one worker only adds its start
LOCAL_MIN_CORES = 3


def default_scheduler(cores: int | None = None) -> str:
    """What ``scheduler=None`` means: ``"local"`` when Dask is installed and this process may use at least
    :data:`LOCAL_MIN_CORES` cores (``cores``: that count, default :func:`default_workers`), else ``"none"``."""
    cores = default_workers() if cores is None else cores
    return "local" if cores >= LOCAL_MIN_CORES and dask_available() else "none"


def check_scheduler(scheduler) -> str:
    """``None`` (:func:`default_scheduler`: local with Dask on at least :data:`LOCAL_MIN_CORES` cores, else none),
    ``"none"``, ``"local"`` or a Dask address."""
    if scheduler is None:
        return default_scheduler()
    s = str(scheduler).strip()
    if s in ("none", "local"):
        pass
    elif "://" in s:
        scheme, _, rest = s.partition("://")
        host, _, port = rest.rpartition(":")
        if scheme not in ("tcp", "tls", "inproc", "ws", "wss", "ucx") or not host or not port.isdigit():
            raise AscendEmuError(f"scheduler {s!r}: give none, local or a Dask scheduler address such as "
                                 "tcp://host:8786")
    else:
        raise AscendEmuError(f"scheduler {s!r}: give none, local or a Dask scheduler address such as tcp://host:8786")
    if s != "none" and not dask_available():
        raise AscendEmuError(f"scheduler {s!r} needs Dask: pip install 'ascend-emu[dask]' (or use --scheduler none)")
    return s


@dataclass
class SweepContext:
    """What every task of a sweep shares: the model, its inputs and the float32 reference.

    ``model`` is a path (each worker loads it once) or a :class:`~ascend_emu.graph.core.Graph`
    (shipped once per worker); ``fingerprint`` is the loaded graph's, checked on the worker.
    ``bench`` is the reference's float outputs, flattened and concatenated (float64);
    ``ref_tensors`` every reference tensor, for tasks whose analysis needs them (else None).
    """

    model: Any
    fingerprint: str
    feeds: dict
    bench: np.ndarray
    signature: str | None = None
    shapes: Any = None
    ref_tensors: dict | None = None

    def __post_init__(self):
        from ..graph.core import Graph

        if isinstance(self.model, Graph) and self.model.graph_def:
            # a replay never reads the serialised GraphDef (the reference does, in this process): shipping
            # it would send the weights twice
            from dataclasses import replace

            self.model = replace(self.model, graph_def=None)


@dataclass
class ReplayTask:
    """One replay of a sweep: ``device`` runs the context's model; ``analyze(result, context)`` -> dict."""

    name: str
    device: Any
    dump: str | None = None
    analyze: Callable | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class TaskResult:
    """What a task sends back: small numbers, never tensors."""

    name: str
    ok: bool
    metrics: dict = field(default_factory=dict)
    fired: dict = field(default_factory=dict)
    float_status: int = 0
    dump: str | None = None
    seconds: float = 0.0
    analysis: dict | None = None
    error: str | None = None
    attempts: int = 1
    worker: str = ""


def _one_line(e: BaseException) -> str:
    """An exception a task raised, as one line: its type and its message's lines joined."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def raise_failures(results) -> None:
    """Raise one AscendEmuError naming every task that failed after its retry."""
    bad = [r for r in results if not r.ok]
    if bad:
        lines = "; ".join(f"{r.name}: {r.error}" for r in bad)
        raise AscendEmuError(f"{len(bad)} replay(s) of the sweep failed after {RETRIES + 1} attempts: {lines}")


# --------------------------------------------------------------------------------------------- worker side

#: per-process cache: (path, its mtime and size, signature, shapes) -> loaded graph. A worker loads a model
#: file once and keeps it across sweeps (a long-running cluster serves several commands); a changed file
#: has a new key. Graphs shipped in the context need no cache: Dask keeps the context on the worker.
_LOADED: dict = {}
_LOADED_MAX = 2


def _load_key(ctx: SweepContext):
    path = os.path.abspath(os.fspath(ctx.model))
    try:
        st = os.stat(path)
    except OSError as e:
        raise AscendEmuError(f"{path}: not readable on this worker ({e.strerror}); a remote cluster needs the "
                             "model on a path every worker can read") from None
    return (path, st.st_mtime_ns, st.st_size, ctx.signature, repr(ctx.shapes))


def _graph_of(ctx: SweepContext):
    from ..frontend.tf.loader import load_graph
    from ..graph.core import Graph

    if isinstance(ctx.model, Graph):
        return ctx.model
    key = _load_key(ctx)
    graph = _LOADED.get(key)
    if graph is None:
        graph = load_graph(ctx.model, signature=ctx.signature, input_shapes=ctx.shapes)
        while len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = graph
    if graph.fingerprint != ctx.fingerprint:
        raise AscendEmuError(f"{ctx.model} loads as a different graph on this worker than where the sweep "
                             "started (fingerprints differ); give every worker the same file")
    return graph


def remember(graph, ctx: SweepContext) -> None:
    """Seed this process's cache with a graph already loaded here (scheduler none loads nothing twice)."""
    if not isinstance(ctx.model, type(graph)):
        _LOADED.clear()
        _LOADED[_load_key(ctx)] = graph


def _staging(dump: str, token: str) -> str:
    head, tail = os.path.split(os.path.abspath(dump))
    return os.path.join(head, f".{tail}.sweep-{token}")


def run_task(ctx: SweepContext, task: ReplayTask, token: str) -> TaskResult:
    """Run one task where it lands (a worker, or this process); an error comes back in the result."""
    import socket

    t0 = time.perf_counter()
    where = f"{socket.gethostname()}:{os.getpid()}"
    stage = _staging(task.dump, token) if task.dump else None
    try:
        graph = _graph_of(ctx)
        dev = copy.copy(task.device)
        dev._fusion_cache = {}
        res = dev.replay(graph, ctx.feeds, dump_dir=stage, overwrite=True, progress=False,
                         keep_tensors=task.analyze is not None)
        out = flat_outputs(res.outputs[t] for t in graph.outputs)
        metrics = output_metrics(out, ctx.bench)
        analysis = task.analyze(res, ctx) if task.analyze is not None else None
        if stage is not None:
            _place(stage, task.dump)
        return TaskResult(task.name, True, metrics, dict(res.summary.get("fusion_counts", {})),
                          int(res.float_status.get()), task.dump, time.perf_counter() - t0, analysis, worker=where)
    except Exception as e:   # sent back, retried once, then reported by the client
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        msg = str(e) if isinstance(e, AscendEmuError) else f"{type(e).__name__}: {e}"
        return TaskResult(task.name, False, error=msg, seconds=time.perf_counter() - t0, worker=where)


def _place(stage: str, dest: str) -> None:
    """Move a complete dump from its staging directory into place (replacing an older dump there)."""
    from ..analysis.dump import check_dump_dir

    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        check_dump_dir(dest, True)    # refuses a directory holding anything but a dump
        shutil.rmtree(dest)
    os.replace(stage, dest)


def output_metrics(npu, bench) -> dict:
    """cosine, max_rel_err, max_abs_err, rmse of ``npu`` against ``bench`` (float64, flat).

    The numbers are :func:`ascend_emu.analysis.metrics.tensor_metrics`'s, the comparison's
    one implementation (NUMERICS.md section 7), with the float32 reference's eps where the
    bench value is 0: positions holding the same inf or nan on both sides are zeroed, and
    an inf or nan on one side only makes every metric nan, the worst value. Empty outputs
    compare as equal.
    """
    from ..analysis.metrics import NAN, tensor_metrics

    n = np.asarray(npu, dtype=np.float64).reshape(-1)
    b = np.asarray(bench, dtype=np.float64).reshape(-1)
    if n.size != b.size:
        raise AscendEmuError(f"output has {n.size} elements, the reference {b.size}")
    if n.size == 0:
        return {"cosine": 1.0, "max_rel_err": 0.0, "max_abs_err": 0.0, "rmse": 0.0}
    m = tensor_metrics(n, b, bench_dtype=np.float32)
    return {k: math.nan if m[c] == NAN else float(m[c]) for k, c in METRIC_COLUMN.items()}


def flat_outputs(arrays) -> np.ndarray:
    """The float outputs, flattened and concatenated in float64 (what the sweep's metrics compare)."""
    parts = [np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays
             if np.asarray(a).dtype.kind == "f" or np.asarray(a).dtype.name == "bfloat16"]
    return np.concatenate(parts) if parts else np.zeros(0)


# --------------------------------------------------------------------------------------------- client side

def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


#: why a LocalCluster's workers fail to start from a script, and what to do
UNGUARDED_SCRIPT = ("a script that runs a sweep (mixlist_search, fusion_bisect, sensitivity, fit, random_errors) "
                    "on scheduler='local' must call it under `if __name__ == \"__main__\":`, because each worker "
                    "process imports the script again; or pass scheduler='none'")


def _importing_main_in_worker() -> bool:
    """True while a spawned process (a LocalCluster's worker) re-imports the script that started it: a sweep
    started there would spawn workers of its own, which multiprocessing refuses (the check is its own,
    ``multiprocessing.spawn._check_not_importing_main``)."""
    import multiprocessing
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


class Sweep:
    """Runs batches of :class:`ReplayTask` on one scheduler; use as a context manager.

    Parameters
    ----------
    scheduler : None, "none", "local" or a Dask address ("tcp://host:8786")
        None: :func:`default_scheduler` (local if Dask is installed and this process may use 3 or more cores,
        else none).
    n_workers : int, optional
        Workers of the LocalCluster (default: the cores this process may use).
    progress : bool
        One progress bar over every replay of the sweep (a batch adds its tasks to the total).
    desc : str
        The bar's label.
    """

    def __init__(self, scheduler=None, *, n_workers: int | None = None, progress: bool = True,
                 desc: str = "sweep"):
        self.scheduler = check_scheduler(scheduler)
        if n_workers is not None and (not isinstance(n_workers, int) or n_workers < 1):
            raise AscendEmuError(f"n_workers must be a positive integer, got {n_workers!r}")
        self.n_workers = n_workers
        self.progress = progress
        self.desc = desc
        self.token = uuid.uuid4().hex[:12]
        self.client = None
        self.cluster = None
        self._ctx_future = None
        self._ctx = None
        self._shared = None       # (the object Sweep.map shares, its future on the cluster)
        self._bar = None
        self._stages: set = set()
        self.replays = 0
        self.seconds = 0.0

    # -- lifetime ---------------------------------------------------------------------------------------
    def __enter__(self):
        if self.scheduler not in ("none", "local"):
            try:
                self._connect()    # an unreachable scheduler fails here, before any slow work
            except BaseException:
                self.close()
                raise
        return self   # a LocalCluster starts with the first batch, once the model and inputs are known good

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def _connect(self):
        if self.client is not None or self.scheduler == "none":
            return
        import logging

        from distributed import Client, LocalCluster

        for name in ("distributed", "distributed.worker", "distributed.scheduler", "distributed.nanny"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        if self.scheduler == "local":
            if _importing_main_in_worker():
                raise AscendEmuError(UNGUARDED_SCRIPT)
            n = self.n_workers or default_workers()
            # one thread per worker, and one Numba thread: n processes already fill n cores
            try:
                self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                            dashboard_address=":0",
                                            # a failed call comes back to the caller, which names it in one
                                            # line: the workers' own "Compute Failed" tracebacks stay quiet
                                            silence_logs=logging.CRITICAL,
                                            env={"NUMBA_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
            except RuntimeError as e:   # distributed's "Nanny failed to start." says nothing of why
                main = sys.modules.get("__main__")
                # the missing guard is the likely cause only when a script file started the process (an
                # interactive session or `python -c` is not re-imported); ports or memory fail the same way
                hint = (f"if the script does not run the sweep under `if __name__ == \"__main__\":`, that is "
                        f"the likely cause: {UNGUARDED_SCRIPT}" if getattr(main, "__file__", None)
                        else "pass scheduler='none' to run serially")
                raise AscendEmuError(f"the local Dask cluster's workers did not start ({e}); {hint}") from None
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(self.scheduler, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as e:
                raise AscendEmuError(f"cannot reach the Dask scheduler at {self.scheduler} ({e}); start one with "
                                     "`dask scheduler` and workers with `dask worker ADDRESS`, or use --scheduler "
                                     "local") from None

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._shared = self._ctx = self._ctx_future = None     # their futures die with the client
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None
        if self.cluster is not None:
            try:
                self.cluster.close()
            finally:
                self.cluster = None
        self._cleanup()

    def _cleanup(self):
        """Remove staging directories of dumps that never completed (an interrupted or failed sweep)."""
        for s in sorted(self._stages):
            if os.path.isdir(s) and not os.path.islink(s):
                shutil.rmtree(s, ignore_errors=True)
        self._stages.clear()

    # -- running ----------------------------------------------------------------------------------------
    def _progress(self, n: int):
        if not self.progress:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=0, desc=self.desc, unit="replay", leave=False, dynamic_ncols=True, disable=None)
        self._bar.total += n
        self._bar.refresh()

    def _tick(self):
        if self._bar is not None:
            self._bar.update(1)

    def run(self, ctx: SweepContext, tasks: list) -> list:
        """Run ``tasks`` against ``ctx``; the results come back in task order (whatever order they finish in)."""
        tasks = list(tasks)
        if not tasks:
            return []
        t0 = time.perf_counter()
        for t in tasks:
            if t.dump:
                self._stages.add(_staging(t.dump, self.token))
        self._progress(len(tasks))
        try:
            if self.scheduler == "none":
                results = [self._serial(ctx, t) for t in tasks]
            else:
                self._connect()
                results = self._distributed(ctx, tasks)
        except BaseException:
            # Ctrl-C or a lost cluster: cancel what is pending, leave no half-written dump
            self.close()
            raise
        self.replays += sum(r.attempts for r in results)
        self.seconds += time.perf_counter() - t0
        return results

    def map(self, fn, items, *, names=None, shared=None) -> list:
        """``[fn(item) for item in items]`` on this sweep's scheduler, results in item order; with ``shared``,
        ``[fn(shared, item) ...]``.

        For jobs whose tasks are not replays of one model (the runs of a random-error detection, a fit's
        candidates): ``fn`` is a module-level function (workers import it by name) and each item small and
        picklable. ``shared`` is what every call reads (a fit's dump tensors and model): it goes to each worker
        once per sweep however many calls and batches use it (the same object again is not sent again), where
        a worker keeps it. A call that raises is retried once; a second failure stops the sweep with one line
        naming the item (an :class:`AscendEmuError` keeps its own message)."""
        items = list(items)
        names = list(names) if names is not None else [f"task {i}" for i in range(len(items))]
        if not items:
            return []
        t0 = time.perf_counter()
        self._progress(len(items))
        try:
            if self.scheduler == "none":
                call = fn if shared is None else functools.partial(fn, shared)
                out = [self._call(call, item, name) for item, name in zip(items, names)]
            else:
                self._connect()
                out = self._map_distributed(fn, items, names, shared)
        except BaseException:
            self.close()
            raise
        self.replays += len(items)
        self.seconds += time.perf_counter() - t0
        return out

    def _call(self, fn, item, name):
        for attempt in range(1, RETRIES + 2):
            try:
                r = fn(item)
                break
            except AscendEmuError:
                raise      # the user's error: the same on a second try
            except Exception as e:   # noqa: BLE001 - retried once, then named
                if attempt > RETRIES:
                    raise AscendEmuError(f"{name} failed twice: {_one_line(e)}") from None
        self._tick()
        return r

    def _shared_future(self, shared):
        """``shared`` on the cluster: scattered to every worker once, then referred to by its future."""
        if self._shared is None or self._shared[0] is not shared:
            self._shared = (shared, self.client.scatter(shared, broadcast=True, hash=False))
        return self._shared[1]

    def _map_distributed(self, fn, items, names, shared=None):
        def outcome(i, f, attempt):
            try:
                return f.result(), False
            except AscendEmuError:
                raise
            except Exception as e:   # noqa: BLE001 - the worker died or the call raised there
                if attempt > RETRIES:
                    raise AscendEmuError(f"{names[i]} failed twice: {_one_line(e)}") from None
                return None, True

        head = () if shared is None else (self._shared_future(shared),)
        name = getattr(fn, "__name__", "call")
        return self._as_completed(len(items), lambda i: self.client.submit(
            fn, *head, items[i], pure=False, key=f"{name}-{uuid.uuid4().hex}"), outcome)

    def _as_completed(self, n: int, submit, outcome) -> list:
        """Calls ``0 .. n-1`` on the cluster (``submit(i)`` -> a future), results in call order; ``outcome(i,
        future, attempt)`` -> (value, retry): a call asking for a retry is submitted once more, then its value
        stands. Ctrl-C or an error cancels what is pending."""
        from distributed import as_completed

        fut = {submit(i): (i, 1) for i in range(n)}
        out: list = [None] * n
        ac = as_completed(list(fut))
        try:
            for f in ac:
                i, attempt = fut.pop(f)
                value, retry = outcome(i, f, attempt)
                if retry and attempt <= RETRIES:
                    nf = submit(i)
                    fut[nf] = (i, attempt + 1)
                    ac.add(nf)
                    continue
                out[i] = value
                self._tick()
        except BaseException:
            self.client.cancel(list(fut))
            raise
        return out

    def _serial(self, ctx, task):
        r = None
        for attempt in range(1, RETRIES + 2):
            r = run_task(ctx, task, self.token)
            r.attempts = attempt
            if r.ok:
                break
        self._tick()
        return r

    def _distributed(self, ctx, tasks):
        c = self.client
        if self._ctx is not ctx:
            # shipped once to every worker; tasks refer to it by its future
            self._ctx_future = c.scatter(ctx, broadcast=True, hash=False)
            self._ctx = ctx

        def outcome(i, f, attempt):
            try:
                r = f.result()
            except Exception as e:   # the worker died or the task could not run there
                r = TaskResult(tasks[i].name, False, error=_one_line(e))
            r.attempts = attempt
            return r, not r.ok

        return self._as_completed(len(tasks), lambda i: c.submit(
            run_task, self._ctx_future, tasks[i], self.token, pure=False, key=f"{tasks[i].name}-{uuid.uuid4().hex}"),
            outcome)
