"""A script ported to Ascend, unchanged, on the emulated NPU: the device side of ``ascend-emu run``.

A ported script sets its NPU options itself: a TF1 session's ``NpuOptimizer`` ``parameter_map``,
``set_keras_session_npu_config``, ``NPURunConfig``, TF2's ``npu.global_options()`` before ``npu.open()``.
The shim packages ``npu_bridge`` and ``npu_device`` (:mod:`ascend_emu.frontend.tf.shim`) decode those
options and hand them to :class:`ScriptRun`, which checks them as the adapter does
(:mod:`ascend_emu.frontend.tf.shim.options`), builds the :class:`~ascend_emu.npu.emulate.Emulation` they
describe and is the runner of the interceptions (:mod:`ascend_emu.frontend.tf.hooks`): each training step
of the script runs on that emulation. A script that configures a new session with other options starts a
new emulation (a new *segment* of the record); one that trains before configuring anything gets the
adapter's defaults for the SoC.

The record (:meth:`ScriptRun.to_json`) names every option taken from the script, its value, where it was
set (file:line and how) and whether it changed the emulated device (``honoured``) or nothing on a CPU
(``noted``, with why).
"""
from __future__ import annotations

import os
import shutil

from ..errors import AscendEmuError
from ..frontend.tf.shim.options import dump_steps, option_status, read_parameter_map
from .emulate import Emulation
from .loss_scale import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .precision import load_customize_dtypes
from .tf1 import NPULossScaleOptimizer

#: op_select_implmode -> the device's impl_mode (the *_for_all forms differ only in which ops they reach)
_IMPL_MODE = {"high_precision": "high_precision", "high_performance": "high_performance",
              "high_precision_for_all": "high_precision", "high_performance_for_all": "high_performance"}
#: npu_plugin.set_device_sat_mode / npu.set_device_sat_mode: 0 saturation, 1 INF/NaN
SAT_MODES = {0: "saturation", 1: "inf_nan"}


def device_options(params: dict, soc: str, sat_mode=None, keep_dtype=()) -> dict:
    """:class:`~ascend_emu.npu.device.Device` keywords of a checked parameter_map."""
    opts = {"soc": soc}
    for key in ("precision_mode", "precision_mode_v2", "modify_mixlist"):
        if key in params:
            opts[key] = params[key]
    if "fusion_switch_file" in params:
        opts["fusion_switch"] = params["fusion_switch_file"]
    if "op_select_implmode" in params:
        opts["impl_mode"] = _IMPL_MODE[params["op_select_implmode"]]
    if "deterministic" in params:
        opts["deterministic"] = bool(int(params["deterministic"]))
    if sat_mode is not None:
        opts["overflow_mode"] = SAT_MODES[sat_mode]
    if keep_dtype:
        opts["keep_dtype"] = list(keep_dtype)
    return opts


class ScriptRun:
    """The runner of a ported script's training steps, configured by the options the script sets.

    The shim reaches it through :func:`ascend_emu.frontend.tf.shim.runtime.runtime`: ``configure`` (a
    parameter_map and where it was set), ``set_sat_mode``, ``keep_dtype`` (names under ``keep_dtype_scope``)
    and the adapter's classes it adapts (``FixedLossScaleManager``, ``ExponentialUpdateLossScaleManager``,
    ``NPULossScaleOptimizer``).
    """

    FixedLossScaleManager = FixedLossScaleManager
    ExponentialUpdateLossScaleManager = ExponentialUpdateLossScaleManager
    NPULossScaleOptimizer = NPULossScaleOptimizer

    def __init__(self, script: str, argv=(), *, soc: str = "Ascend910", ranks: int = 1):
        self.script = os.path.abspath(script)
        self.argv = list(argv)
        self.soc = soc
        #: each step over this many emulated data-parallel ranks (the script's batch split among them); the
        #: script's own rank helpers still say one rank: it is one process
        self.ranks = ranks
        self.segments: list = []        # [{"from", "parameter_map", "emulation"}], the current one last
        self.options: list = []         # every option the script set: name, value, from, status, note
        self.notes: list = []           # calls that change nothing here (init_resource, hccl, ...), once each
        self.overflow_dumps: dict = {}  # step -> {"dump", "report", "first"}
        self.msprobe_dumps: dict = {}   # step -> its dump in msprobe's layout (--msprobe)
        self.sat_mode = None
        self.keep_dtype_names: list = []
        self._sat_from = None

    # -- what the script sets ---------------------------------------------------------------------
    def configure(self, params: dict, source: str) -> None:
        """The options of one NPU session (a parameter_map, decoded), set at ``source``; checked as the adapter
        checks them, then the emulated device they describe (a new segment when it differs from the current
        one and that one has trained)."""
        try:
            read_parameter_map(params)
        except AscendEmuError as e:
            raise type(e)(f"{source}: {e}") from None
        for key in sorted(params):
            status, note = option_status(key)
            entry = {"name": key, "value": params[key], "from": source, "status": status, "note": note}
            if entry not in self.options:
                self.options.append(entry)
        cur = self.segments[-1] if self.segments else None
        settings = (self.sat_mode, tuple(self.keep_dtype_names))
        if cur is not None and cur["parameter_map"] == params and cur["settings"] == settings:
            return      # the same device: its steps go on (a second session of the same config)
        emulation = self._emulation(params)
        seg = {"from": source, "parameter_map": dict(params), "settings": settings, "emulation": emulation}
        if cur is not None and not cur["emulation"].steps:
            self.segments[-1] = seg
        else:
            self.segments.append(seg)

    def _emulation(self, params: dict) -> Emulation:
        dump_dir = steps = None
        if params.get("enable_dump"):
            dump_dir, steps = params["dump_path"], dump_steps(params.get("dump_step"))
        elif params.get("enable_dump_debug"):
            dump_dir, steps = params["dump_path"], "all"
        keep = list(self.keep_dtype_names) + self._customize_dtypes(params)
        emulation = Emulation(dump_dir=dump_dir, dump_steps=steps, overwrite=True, ranks=self.ranks,
                              **device_options(params, self.soc, self.sat_mode, keep))
        # the adapter's check: the float status under saturation, the parent optimizer's isfinite under INF/NaN
        emulation.overflow_check = "status" if emulation.device.overflow_mode == "saturation" else "isfinite"
        emulation.dump_debug = bool(params.get("enable_dump_debug"))
        return emulation

    def _customize_dtypes(self, params: dict) -> list:
        """customize_dtypes entries that keep an op or op type in float32 (the device's keep_dtype); the adapter
        ignores the file under origin / must_keep_origin_dtype. Entries asking for 16-bit dtypes are said."""
        path = params.get("customize_dtypes")
        mode = params.get("precision_mode_v2", params.get("precision_mode"))
        if path is None or mode in ("origin", "must_keep_origin_dtype"):
            return []
        keep, other = load_customize_dtypes(path)
        for line in other:
            self.note(f"customize_dtypes {line!r}: a 16-bit dtype is not emulated; the op keeps the precision "
                      "mode's dtypes", path)
        return keep

    def set_sat_mode(self, mode, source: str) -> None:
        """npu_plugin.set_device_sat_mode(mode): 0 saturation, 1 INF/NaN (applies to the sessions after it)."""
        if mode not in SAT_MODES:
            raise AscendEmuError(f"{source}: set_device_sat_mode: mode must be 0 (saturation) or 1 (INF/NaN), "
                                 f"got {mode!r}")
        self.sat_mode = mode
        self.options.append({"name": "sat_mode", "value": mode, "from": source, "status": "honoured",
                             "note": f"the device's overflow_mode {SAT_MODES[mode]}"})
        self._rebuild()

    def keep_dtype(self, names, source: str) -> None:
        """Op names created under ``keep_dtype_scope``: kept in their original dtype by the sessions after it."""
        new = [n for n in names if n not in self.keep_dtype_names]
        if not new:
            return
        self.keep_dtype_names.extend(new)
        self.options.append({"name": "keep_dtype_scope", "value": new, "from": source, "status": "honoured",
                             "note": "the device's keep_dtype (these ops keep float32 under any precision mode)"})
        self._rebuild()

    def _rebuild(self) -> None:
        """A setting that applies to the sessions after it also applies to the current one before it trains."""
        if self.segments and not self.segments[-1]["emulation"].steps:
            seg = self.segments.pop()
            self.configure(seg["parameter_map"], seg["from"])

    def note(self, what: str, source: str) -> None:
        """A call that changes nothing on the emulated device, recorded once."""
        entry = {"call": what, "from": source}
        if entry not in self.notes:
            self.notes.append(entry)

    # -- the runner the interceptions call --------------------------------------------------------
    @property
    def emulation(self) -> Emulation:
        if not self.segments:
            self.configure({}, "the adapter's defaults (the script set no NPU options before training)")
        return self.segments[-1]["emulation"]

    def train(self, step, x, y, state: dict, *, key, loss_scale=None) -> dict:
        em = self.emulation
        rec = em.train(step, x, y, state, key=key, loss_scale=loss_scale)
        if em.dump_debug:
            self._overflow_dump(em, rec["step"], rec)
        return rec

    def _overflow_dump(self, em: Emulation, i: int, rec: dict) -> None:
        """enable_dump_debug: keep the dump of a step whose float status was set, with its overflow analysis
        beside it (dump_path/step-N.overflow.json and .txt); drop the others, as the device writes nothing."""
        from ..analysis.overflow import overflow_report
        from ..fileio import atomic_write_text
        import json

        path = em.dumps.get(i)
        if path is None:
            return
        if not rec["float_status"]:
            shutil.rmtree(path, ignore_errors=True)
            del em.dumps[i]
            return
        report = overflow_report(path)
        base = os.path.join(em.dump_dir, f"step-{i}.overflow")
        atomic_write_text(base + ".json", json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n")
        atomic_write_text(base + ".txt", report.format_text() + "\n")
        first = report.first
        self.overflow_dumps[i] = {"dump": path, "report": base + ".json",
                                  "first": None if first is None else {"name": first["name"],
                                                                       "tf_type": first["tf_type"]}}

    def forward(self, graph, feeds: dict) -> list:
        return self.emulation.forward(graph, feeds)

    def tf1_loss_scale(self, graph, op_name: str):
        return self.emulation.tf1_loss_scale(graph, op_name)

    def manager_state(self, key):
        return self.emulation.manager_state(key)

    def end(self) -> None:
        for seg in self.segments:
            seg["emulation"].end()

    def export_msprobe(self) -> dict:
        """Each dump of the run also in msprobe's layout, ``dump_path/msprobe/step{N}/rank0`` (the steps keep their
        numbers); ``{step: directory}``, also in the record as ``msprobe_dumps``."""
        from ..analysis.msprobe import export_msprobe

        for seg in self.segments:
            em = seg["emulation"]
            for k, path in sorted(em.dumps.items()):
                self.msprobe_dumps[k] = export_msprobe(path, os.path.join(em.dump_dir, "msprobe"), step=k,
                                                       overwrite=True)
        return self.msprobe_dumps

    # -- the record ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """``{"script", "argv", "soc", "options", "notes", "segments", "overflow_dumps", "msprobe_dumps"}``; each
        segment has
        ``from`` (where its options were set), ``parameter_map`` and the emulation's record (``config``,
        ``steps``, ``dumps``)."""
        return {"script": self.script, "argv": self.argv, "soc": self.soc, "ranks": self.ranks,
                "options": self.options,
                "notes": self.notes,
                "segments": [{"from": s["from"], "parameter_map": s["parameter_map"], **s["emulation"].to_json()}
                             for s in self.segments],
                "overflow_dumps": {str(k): v for k, v in sorted(self.overflow_dumps.items())},
                "msprobe_dumps": {str(k): v for k, v in sorted(self.msprobe_dumps.items())}}

    def format_text(self) -> str:
        """A few lines: the options and calls that change nothing here; each segment's device, where its options
        came from, its steps and skipped steps; the dumps."""
        lines = [f"noted: {o['name']} ({o['from']}): changes nothing here: {o['note']}" for o in self.options
                 if o["status"] == "noted"]
        lines += [f"noted: {n['call']} ({n['from']})" for n in self.notes]
        if not self.segments:
            return "\n".join(lines + ["ascend-emu run: the script trained nothing on the emulated NPU"])
        for s in self.segments:
            em = s["emulation"]
            d = em.device.config()
            mode = d.get("precision_mode")
            scale = em.config["loss_scale"]
            skipped = em.skipped_steps()
            ranks = f" x{em.ranks} ranks ({em.allreduce} all-reduce)" if em.ranks > 1 else ""
            lines.append(f"ascend-emu run: {len(em.steps)} step(s) on the emulated {d['soc']}{ranks}, precision_mode "
                         f"{mode}, overflow {d['overflow_mode']}, loss scale "
                         f"{scale if isinstance(scale, str) else scale.get('kind')}"
                         f"{f', {skipped} skipped' if skipped else ''} (options: {s['from']})")
            for k in sorted(em.dumps) if not em.dump_debug else ():
                lines.append(f"dump of step {k}: {em.dumps[k]}")
        for k, v in sorted(self.overflow_dumps.items()):
            f = v["first"]
            lines.append(f"overflow dump of step {k}: {v['dump']}; first overflow: "
                         + (f"{f['name']} ({f['tf_type']})" if f else "not found") + f"; analysis {v['report']}")
        for k, v in sorted(self.msprobe_dumps.items()):
            lines.append(f"msprobe dump of step {k}: {v}")
        return "\n".join(lines)


__all__ = ["ScriptRun", "device_options", "SAT_MODES"]
