"""Fusion bisection: find the fusion rules that cost a model accuracy.

precision_tool's "fusion exception detection" turns every fusion off and looks
whether accuracy comes back; it cannot say which rule is at fault. Here the model
is replayed with every rule on and every rule off; if the final output against the
float32 TensorFlow reference is worse with fusion on by more than the threshold,
delta debugging (Zeller's ddmin) over the rules that fired finds a minimal set of
rules whose enabling alone (all others off) reproduces the loss. Only the fusion
switch varies between replays; the device's precision mode, overflow mode etc. stay.

With training data (``data``, ``steps``) every configuration trains instead, and the score is the loss
curve's distance to the float32 training's (:mod:`.bisect_train`).
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import AscendEmuError
from ..fileio import make_output_dir
from ..npu.fusion import GRAPH, RULES, UB
from .sweep import flat_outputs, reference_engine

METRICS = ("cosine", "max_rel_err", "max_abs_err", "rmse")
#: default thresholds: cosine may drop by this much; an error may grow by this fraction
DEFAULT_THRESHOLDS = {"cosine": 1e-3, "max_rel_err": 0.5, "max_abs_err": 0.5, "rmse": 0.5}
# output_metrics and METRIC_COLUMN live with the sweep (its workers compute them) and are re-exported here
from .sweep import METRIC_COLUMN, output_metrics  # noqa: E402,F401


def _worse(value: float, baseline: float, metric: str, threshold: float) -> bool:
    """True if ``value`` is worse than ``baseline`` by more than ``threshold`` (nan is the worst)."""
    if math.isnan(value):
        return not math.isnan(baseline)
    if math.isnan(baseline):
        return False
    if metric == "cosine":
        return baseline - value > threshold
    return value - baseline > threshold * max(baseline, 1e-30)


@dataclass
class Trial:
    """One replay: which rules were on, what fired, the final output's metrics."""

    name: str
    enabled: tuple            # rules switched on (all of them for "all-on")
    metrics: dict
    fired: dict               # rule -> times it fired
    float_status: int
    degraded: bool | None     # worse than all-off by more than the threshold (None for all-off); training:
    #                           its distance to the reference differs from all-off's by more than the threshold
    dump: str | None = None
    losses: list | None = None   # a training's loss curve

    def to_json(self) -> dict:
        return {"name": self.name, "enabled": list(self.enabled), "metrics": {k: _num(v) for k, v in
                                                                              self.metrics.items()},
                "fired": dict(self.fired), "float_status": self.float_status, "degraded": self.degraded,
                "dump": self.dump, "losses": None if self.losses is None else [_num(v) for v in self.losses]}


@dataclass
class BisectResult:
    """What :func:`fusion_bisect` found. ``culprits``: the minimal set of rules (empty if fusion does not hurt)."""

    model: str
    metric: str
    threshold: float
    precision_mode: str
    trials: list = field(default_factory=list)
    fired: list = field(default_factory=list)
    culprits: list = field(default_factory=list)
    degraded: bool = False
    steps: int | None = None                 # a training's steps (None: a replay)
    reference_losses: list | None = None     # the float32 training's loss curve
    reference: str = "TensorFlow"            # what computed the float32 reference (onnxruntime: an ONNX model)

    @property
    def training(self) -> bool:
        return self.steps is not None

    def to_json(self) -> dict:
        """Every configuration tried and the verdict, as ``fusion-bisect --json`` writes it."""
        return {"model": self.model, "metric": self.metric, "threshold": self.threshold,
                "precision_mode": self.precision_mode, "training": self.training, "steps": self.steps,
                "reference_losses": (None if self.reference_losses is None
                                     else [_num(v) for v in self.reference_losses]),
                "fired": list(self.fired), "degraded": self.degraded, "culprits": list(self.culprits),
                "pass": self.culprits[0] if self.training and self.culprits else None,
                "verdict": self.verdict(), "trials": [t.to_json() for t in self.trials]}

    def trial(self, name: str) -> Trial:
        for t in self.trials:
            if t.name == name:
                return t
        raise KeyError(name)

    def verdict(self) -> str:
        on, off = self.trial("all-on"), self.trial("all-off")
        m = self.metric
        head = f"{m} with fusion on {_fmt(on.metrics[m])}, off {_fmt(off.metrics[m])}"
        if self.training:
            return self._train_verdict(head)
        if not self.degraded:
            return f"fusion does not cost accuracy here ({head}; threshold {self.threshold:g})"
        if not self.culprits:
            return (f"fusion costs accuracy ({head}) but no subset of the rules that fired reproduces it alone; "
                    "the loss needs rules together with all others")
        rules = ", ".join(self.culprits)
        return (f"fusion costs accuracy ({head}); minimal set of rules responsible: {rules}. "
                f"Switch {'it' if len(self.culprits) == 1 else 'them'} off with a fusion switch file: "
                + _switch_hint(self.culprits))

    def _train_verdict(self, head: str) -> str:
        span = f"over {self.steps} training step{'s' if self.steps != 1 else ''}"
        if not self.degraded:
            return (f"the fusion switch does not change the loss curve's distance to float32 {span} ({head}; "
                    f"threshold {self.threshold:g})")
        if not self.culprits:
            return (f"fusion changes the loss curve {span} ({head}) but no subset of the passes that fired does it "
                    "alone; the change needs passes together with all others")
        first = self.culprits[0]
        rest = (f" (minimal set: {', '.join(self.culprits)}; {first} alone moves the curve most)"
                if len(self.culprits) > 1 else "")
        return (f"fusion changes the loss curve {span} ({head}); the pass whose switch changes it most: "
                f"{first}{rest}. Switch it off with a fusion switch file: " + _switch_hint([first]))

    def format_text(self) -> str:
        """A table of every configuration tried, then the verdict."""
        metrics = TRAIN_COLUMNS if self.training else METRICS
        cols = ["config (rules on)", *metrics, "status", "verdict"]
        rows = []
        for t in self.trials:
            flag = "CHANGED" if self.training else "DEGRADED"
            v = "baseline" if t.degraded is None else (flag if t.degraded else "ok")
            rows.append([t.name, *(_fmt(t.metrics[m]) for m in metrics), f"0x{t.float_status:x}", v])
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        line = lambda r: "  ".join(s.ljust(w) for s, w in zip(r, widths)).rstrip()  # noqa: E731
        what = (f"the loss curve of {self.steps} training steps vs the float32 TensorFlow training's"
                if self.training else f"vs the {self.reference} float32 reference")
        out = [f"fusion-bisect {self.model}: precision_mode {self.precision_mode}, metric {self.metric} "
               f"{what}, threshold {self.threshold:g}",
               f"rules that fired: {', '.join(self.fired) if self.fired else 'none'}", "",
               line(cols), line(["-" * w for w in widths])]
        out += [line(r) for r in rows]
        out += ["", self.verdict()]
        return "\n".join(out)


#: the columns of a training bisection: the distances to the reference curve, and the shift from all-off's
TRAIN_COLUMNS = ("loss_rel_err", "loss_abs_err", "curve_shift")


def _num(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _fmt(v: float) -> str:
    return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.6g}"


def _switch_hint(rules) -> str:
    sw = {GRAPH: {}, UB: {}}
    for r in rules:
        sw[RULES[r].kind][r] = "off"
    import json

    return json.dumps({"Switch": {k: v for k, v in sw.items() if v}})


def _switch(enabled) -> dict:
    """fusion_switch.cfg content with exactly ``enabled`` on."""
    sw = {GRAPH: {"ALL": "off"}, UB: {"ALL": "off"}}
    for r in enabled:
        sw[RULES[r].kind][r] = "on"
    return {"Switch": sw}


def _ddmin(items: list, test, batch=None) -> list:
    """A 1-minimal subset of ``items`` for which ``test`` holds (``test(items)`` is known to hold).

    ``batch(subsets)``, if given, is called with the subsets a round may test before ``test`` is
    asked about them one by one, so a sweep can run them side by side (``test`` then reads its
    results); the subsets chosen, and so the result, are the same with or without it.
    """
    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        if batch is not None:
            batch(chunks)
        for c in chunks:
            if test(c):
                items, n = c, 2
                break
        else:
            rests = [[x for x in items if x not in c] for c in chunks] if len(chunks) > 2 else []
            if batch is not None and rests:
                batch(rests)
            for rest in rests:
                if test(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def fusion_bisect(model, inputs=None, *, device=None, device_kwargs=None, signature=None, shapes=None,
                  seed: int = 0, metric: str | None = None, threshold: float | None = None, keep_dumps=None,
                  progress: bool = True, scheduler="none", n_workers: int | None = None, data=None,
                  steps: int | None = None, **train_options) -> BisectResult:
    """Find the fusion rules responsible for a loss of accuracy, by bisection.

    Parameters
    ----------
    model : Keras model, path, tf.function, ConcreteFunction or Graph
        Anything :func:`ascend_emu.frontend.tf.loader.load_graph` accepts.
    inputs : None, dict or CLI strings
        As :meth:`ascend_emu.npu.device.Device.replay` (None: seeded random inputs).
    device : Device, optional
        The emulated NPU (precision mode, overflow mode, ...); only its fusion switch
        is varied. Default ``Device()``.
    device_kwargs : dict, optional
        ``{"device": Device}`` (what the CLI passes) or keyword arguments for ``Device``.
    signature, shapes, seed
        As :meth:`Device.replay`.
    metric : {"cosine", "max_rel_err", "max_abs_err", "rmse"}, optional
        Accuracy of the final output(s) against the float32 TensorFlow reference (default cosine; a
        training: ``loss_rel_err`` or ``loss_abs_err``, default ``loss_rel_err``).
    threshold : float, optional
        How much worse than all-off a configuration may be before it counts as
        degraded: an absolute drop for cosine (default 1e-3), a relative growth
        for the errors (default 0.5, i.e. 50%).
    keep_dumps : path, optional
        Keep each replay's dump under ``keep_dumps/<config>/`` and the reference's
        under ``keep_dumps/reference/``; by default no dump is written.
    progress : bool
        Show a progress bar (one step per replay).
    scheduler : "none" (default), "local", a Dask address ("tcp://host:8786") or None
        Where the replays run (:mod:`ascend_emu.tools.sweep`); None: its ``default_scheduler`` (local with Dask
        on 3 or more cores, else none).
        Each ddmin round's candidate sets are replayed side by side, so the configurations
        tried, and the result, are the same under every scheduler.
    n_workers : int, optional
        Workers of a local cluster (default: the cores).
    data, steps, train_options
        Bisect over a training instead of a replay: ``data`` (an .npz path, a dict with x and y, or a pair),
        ``steps`` (required) and :meth:`Device.train`'s options (``batch_size``, ``loss``, ``optimizer``,
        ``learning_rate``, ``optimizer_options``, ``loss_scale``, ``shuffle``; ``seed`` is the shuffle's).
        Every configuration trains ``steps`` steps from the same weights on the same batches; ``metric`` is
        ``loss_rel_err`` (default) or ``loss_abs_err`` of the loss curve against one float32 training, and a
        configuration counts when its distance differs from all-off's either way by more than ``threshold``
        (default 0.5) times the smaller. ``culprits`` then lists the minimal set, the pass whose switch
        alone moves the curve most first (:mod:`.bisect_train`).

    Returns
    -------
    BisectResult
        ``print(result.format_text())`` shows every configuration and the verdict.
    """
    from ..npu.device import Device
    from ..npu.fusion import FusionConfig
    from ..graph.core import Graph
    from ..frontend.inputs import make_inputs
    from ..frontend.tf.loader import load_graph
    from ..frontend.tf.reference import reference
    from .sweep import ReplayTask, Sweep, SweepContext, check_scheduler, raise_failures, remember, sweep_device

    from .bisect_train import DEFAULT_TRAIN_THRESHOLD, TRAIN_METRICS, SubsetTrials, check_training

    check_training(data, steps, train_options, inputs, shapes, signature, keep_dumps)
    if data is not None:
        metric = "loss_rel_err" if metric is None else metric
        if metric not in TRAIN_METRICS:
            raise AscendEmuError(f"metric {metric!r}: a training bisection scores the loss curve; choose one of: "
                                 f"{', '.join(TRAIN_METRICS)}")
        threshold = DEFAULT_TRAIN_THRESHOLD if threshold is None else float(threshold)
    elif (metric := "cosine" if metric is None else metric) not in METRICS:
        raise AscendEmuError(f"unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")
    else:
        threshold = DEFAULT_THRESHOLDS[metric] if threshold is None else float(threshold)
    if not threshold >= 0:
        raise AscendEmuError(f"threshold must be a number >= 0, got {threshold!r}")
    scheduler = check_scheduler(scheduler)
    device = sweep_device(device, device_kwargs)
    if not isinstance(device, Device):
        raise AscendEmuError("device must be an ascend_emu.Device")
    if keep_dumps is not None:
        make_output_dir(keep_dumps, "--keep-dumps")   # before the slow part: a bad directory fails at once

    def dump_dir(name):
        return None if keep_dumps is None else os.path.join(os.fspath(keep_dumps), name)

    if data is not None:
        from .bisect_train import run_training_bisect

        def device_with(switch):
            dev = copy.copy(device)
            dev.fusion = FusionConfig.load(_switch(switch) if isinstance(switch, tuple) else switch)
            dev._fusion_cache = {}
            return dev

        name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else str(getattr(model, "name", "model"))
        result = BisectResult(name, metric, threshold, device.precision.requested_mode, steps=int(steps))
        with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="fusion-bisect") as sweep:
            run_training_bisect(result, sweep, device, model, data, int(steps), seed,
                                {k: v for k, v in train_options.items() if v is not None}, device_with, _ddmin,
                                tuple(RULES), Trial)
        return result
    # the cluster first: an unreachable scheduler fails before the model is even loaded
    with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="fusion-bisect") as sweep:
        graph = model if isinstance(model, Graph) else load_graph(model, signature=signature, input_shapes=shapes)
        if isinstance(inputs, (list, tuple)) and not inputs:
            inputs = None   # the CLI's empty --input list: seeded random inputs
        feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
        ref = reference(graph, feeds, dump_dir=dump_dir("reference"), overwrite=True, progress=False)
        bench = _flat(ref.outputs[t] for t in graph.outputs)
        # a model given by path is loaded by each worker from the path; otherwise the graph is shipped
        path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        ctx = SweepContext(path or graph, graph.fingerprint, feeds, bench, signature=signature, shapes=shapes)
        remember(graph, ctx)
        result = BisectResult(graph.name, metric, threshold, device.precision.requested_mode,
                              reference=reference_engine(graph))

        def task(name, switch):
            dev = copy.copy(device)
            dev.fusion = FusionConfig.load(switch)
            dev._fusion_cache = {}
            return ReplayTask(name, dev, dump_dir(name))

        def trial(name, enabled, r):
            return Trial(name, tuple(enabled), r.metrics, r.fired, r.float_status, None, r.dump)

        off_r, on_r = sweep.run(ctx, [task("all-off", "off"), task("all-on", None)])
        raise_failures([off_r, on_r])
        off = trial("all-off", (), off_r)
        result.trials.append(off)
        on = trial("all-on", tuple(RULES), on_r)
        on.degraded = _worse(on.metrics[metric], off.metrics[metric], metric, threshold)
        result.trials.append(on)
        result.fired = [r for r in RULES if on.fired.get(r)]
        result.degraded = on.degraded
        if on.degraded:
            def run_batch(keys):
                names = [f"only-{'+'.join(k)}" for k in keys]
                runs = sweep.run(ctx, [task(n, _switch(k)) for n, k in zip(names, keys)])
                raise_failures(runs)
                out = []
                for n, k, r in zip(names, keys, runs):
                    t = trial(n, k, r)
                    t.degraded = _worse(t.metrics[metric], off.metrics[metric], metric, threshold)
                    result.trials.append(t)
                    out.append(t)
                return out

            trials = SubsetTrials(result.fired, run_batch, on)
            culprits = _ddmin(list(result.fired), trials.test, trials.batch)
            result.culprits = culprits if trials.test(culprits) else []
    return result


def _flat(arrays) -> np.ndarray:
    return flat_outputs(arrays)
