"""The TensorFlow side the stand-in ``npu_bridge`` and ``npu_device`` packages share: where in the script a
call was made, the ``NpuOptimizer`` entry of a session config read into plain values, the adapter's
``npu_config_proto`` and session patch, its TF2 option object and the one-rank collectives.

Every option is handed to the run (:func:`.runtime.runtime`, an :class:`ascend_emu.npu.bridge.ScriptRun`)
with the place the script set it; calls that change nothing on the emulated device are recorded as notes.
"""
from __future__ import annotations

import contextlib
import os
import sys
import sysconfig

from ....errors import AscendEmuError
from ..intercept import _bypassed
from ..tf import import_tf
from .options import PRECISION_MODE_LIST, PRECISION_MODE_V2_LIST, AdapterOptionError
from .runtime import runtime

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
#: frames of these are never the script's line: ascend_emu itself, the standard library (contextlib, runpy)
_NOT_SCRIPT = (_ROOT, sysconfig.get_paths()["stdlib"])


def where() -> str:
    """``file:line`` of the innermost frame of the user's script (outside ascend_emu and installed packages)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_NOT_SCRIPT) or "site-packages" in name or name.startswith("<")):
            return f"{os.path.basename(name)}:{f.f_lineno}"
        f = f.f_back
    return "the script"


def note(what: str) -> None:
    """Record a call that changes nothing on the emulated device."""
    runtime().note(what, where())


# --------------------------------------------------------------------------- session configs (TF1)

def _attr_value(v):
    which = v.WhichOneof("value")
    if which == "s":
        return v.s.decode("utf-8", "replace")
    if which in ("b", "i", "f"):
        return getattr(v, which)
    if which == "list":
        return [x.decode("utf-8", "replace") for x in v.list.s] or list(v.list.i) or list(v.list.f)
    return None


def npu_optimizer(config_proto):
    """The ``NpuOptimizer`` custom optimizer entry of a ConfigProto, or None."""
    if config_proto is None:
        return None
    for opt in config_proto.graph_options.rewrite_options.custom_optimizers:
        if opt.name == "NpuOptimizer":
            return opt
    return None


def parameter_map(config_proto) -> dict | None:
    """The NpuOptimizer's parameter_map as plain values (bytes decoded), or None without that entry."""
    opt = npu_optimizer(config_proto)
    return None if opt is None else {k: _attr_value(v) for k, v in opt.parameter_map.items()}


def npu_config_proto(config_proto=None):
    """The adapter's ``npu_config_proto`` (H npu_init.py): an NpuOptimizer entry (memory_optimization OFF when it
    adds one), soft placement, remapping OFF, XLA off."""
    tf = import_tf()
    from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

    config = tf.compat.v1.ConfigProto() if config_proto is None else config_proto
    if npu_optimizer(config) is None:
        entry = config.graph_options.rewrite_options.custom_optimizers.add()
        entry.name = "NpuOptimizer"
        config.graph_options.rewrite_options.memory_optimization = RewriterConfig.OFF
    config.allow_soft_placement = True
    config.log_device_placement = False
    config.graph_options.rewrite_options.remapping = RewriterConfig.OFF
    config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.OFF
    return config


_patched: dict = {}
_made_by: list = []         # the adapter helper making a session right now (set_keras_session_npu_config, ...)


def npu_session(helper: str, config):
    """A ``tf.compat.v1.Session`` of ``npu_config_proto(config)`` made by the adapter's ``helper``, so the record
    names the helper the script called."""
    tf = import_tf()
    _made_by.append(helper)
    try:
        return tf.compat.v1.Session(config=npu_config_proto(config))
    finally:
        _made_by.pop()


def patch_sessions() -> None:
    """Every ``tf.compat.v1.Session`` / ``InteractiveSession`` made from now on reports its NpuOptimizer options
    (none: the adapter's defaults, as after npu_init's ``decorator_tf_session``) to the run."""
    tf = import_tf()
    if _patched:
        return
    for cls in (tf.compat.v1.Session, tf.compat.v1.InteractiveSession):
        original = cls.__init__
        _patched[cls] = original

        def __init__(self, target="", graph=None, config=None, *, _original=original, _name=cls.__name__):
            if _bypassed():         # the emulator's own sessions
                return _original(self, target, graph, config)
            _original(self, target, graph, config)
            params = parameter_map(config)
            maker = _made_by[-1] if _made_by else f"tf.compat.v1.{_name}"
            what = "NpuOptimizer parameter_map" if params is not None else "without NpuOptimizer"
            try:
                runtime().configure(params or {}, f"{maker}(config=...) {what} at {where()}")
            except Exception:
                self.close()
                raise

        cls.__init__ = __init__


def unpatch_sessions() -> None:
    for cls, original in _patched.items():
        cls.__init__ = original
    _patched.clear()


# --------------------------------------------------------------------------- TF2 options

class _Options:
    """An option object of the TF2 adapter: only its fields may be set (an unknown name or a value outside
    the list raises, as NpuBaseConfig does); remembers which fields the script set, in order."""

    _fields: dict = {}          # name -> default
    _choices: dict = {}         # name -> allowed values
    _legacy: tuple = ()         # names older adapters had: accepted, noted

    def __init__(self):
        object.__setattr__(self, "_set", {})

    def __getattr__(self, name):
        if name in type(self)._fields:
            return self._set.get(name, type(self)._fields[name])
        if name in type(self)._legacy:
            return self._set.get(name)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        cls = type(self)
        if name not in cls._fields and name not in cls._legacy:
            raise AdapterOptionError(f"npu.global_options(): '{name}' is not a valid option of "
                                     f"{cls.__name__}")
        if name in cls._choices and value is not None and value not in cls._choices[name]:
            raise AdapterOptionError(f"npu.global_options().{name}: '{value}' not in optional list "
                                     f"{list(cls._choices[name])}")
        self._set[name] = value


class NpuDumpConfig(_Options):
    _fields = {"enable_dump": False, "dump_path": None, "dump_step": None, "dump_mode": "output",
               "enable_dump_debug": False, "dump_debug_mode": "all", "dump_data": "tensor", "dump_layer": None}
    _choices = {"dump_mode": ("input", "output", "all"),
                "dump_debug_mode": ("aicore_overflow", "atomic_overflow", "all"), "dump_data": ("tensor", "stats")}


class NpuProfilingConfig(_Options):
    _fields = {"enable_profiling": False, "profiling_options": None}


class NpuConfig(_Options):
    """``npu.global_options()`` (H TF2/configs/npu_config.py)."""
    _fields = {"precision_mode": None, "precision_mode_v2": None, "modify_mixlist": None,
               "fusion_switch_file": None, "customize_dtypes": None, "op_precision_mode": None,
               "op_select_implmode": None, "optypelist_for_implmode": None, "deterministic": 0,
               "graph_run_mode": 1, "hcom_parallel": True, "is_tailing_optimization": False, "jit_compile": "auto",
               "op_compiler_cache_mode": "enable", "input_fusion_size": 131072, "oo_level": "O3",
               "enable_exception_dump": 2, "op_debug_level": None, "op_debug_config": None, "debug_dir": None,
               "overflow_flag": 1}
    _choices = {"precision_mode": PRECISION_MODE_LIST, "precision_mode_v2": PRECISION_MODE_V2_LIST,
                "op_select_implmode": ("high_performance", "high_precision"), "deterministic": (0, 1),
                "enable_exception_dump": (0, 1, 2)}
    _legacy = ("auto_tune_mode",)

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "dump_config", NpuDumpConfig())
        object.__setattr__(self, "profiling_config", NpuProfilingConfig())

    def parameter_map(self) -> dict:
        """The fields the script set, as the parameter_map keys they become."""
        params = {k: v for k, v in self._set.items() if v is not None}
        params.update({k: v for k, v in self.dump_config._set.items() if v is not None})
        if self.profiling_config._set.get("enable_profiling"):
            params["profiling_mode"] = True
        return params


# --------------------------------------------------------------------------- one rank

def one_rank(name: str):
    """A collective of one rank: its input back, recorded once as a note."""
    def collective(values, *args, **kwargs):
        note(f"{name}: one rank, the values unchanged")
        return values
    collective.__name__ = name
    return collective


@contextlib.contextmanager
def noted_scope(name: str):
    """An adapter scope that changes nothing on the emulated device."""
    note(f"{name}: no effect on the emulated device")
    yield


@contextlib.contextmanager
def keep_dtype_scope():
    """The adapter's ``keep_dtype_scope``: ops created inside keep their dtype under mixed precision. In a TF1
    graph their names go to the device's keep_dtype; elsewhere (eager, Keras 3) the scope is noted."""
    tf = import_tf()
    graph = tf.compat.v1.get_default_graph()
    eager = tf.executing_eagerly()
    before = set() if eager else {o.name for o in graph.get_operations()}
    source = where()
    yield
    if eager:
        runtime().note("keep_dtype_scope under eager execution: no graph ops to mark, nothing kept", source)
        return
    names = [o.name for o in graph.get_operations() if o.name not in before]
    runtime().keep_dtype(names, f"keep_dtype_scope at {source}")


def refuse_estimator(what: str):
    tf = import_tf()
    raise AscendEmuError(f"{what}: tf.estimator is not in the installed TensorFlow {tf.__version__} (removed in 2.16); "
                         "run the model_fn in a tf.compat.v1.Session loop or Keras, or use TensorFlow <= 2.15")
