"""torch_npu's run options, as one mutable object the emulated run reads at every aten call.

torch_npu reads its switches at each kernel launch (ASCEND-FACTS.md section 13.1, 13.7): ``ACL_PRECISION_MODE``
(``torch_npu.npu.set_option``), ``torch.npu.matmul.allow_hf32`` / ``conv.allow_hf32``,
``torch.npu.matmul.cube_math_type``, the compatible-implementation switch, ``use_deterministic_algorithms``
and autocast. A script may change any of them between two ops, so the run keeps them here (``run.options``)
rather than in the device, and :func:`current` gives the active run's options to whoever sets them from the
user's script (the ``torch_npu`` shim). ``sources`` says where each value came from, for the run's record.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields

import torch

from ...errors import AscendEmuError
from ...numerics.policy import SOCS, soc_name

#: the values torch_npu's set_option accepts for ACL_PRECISION_MODE ([PT] torch_npu/npu/npu_config.py
#: ``_option_map``); None = the SoC's default (ASCEND-FACTS.md 13.1: must_keep_origin_dtype from the 910B1 on,
#: allow_fp32_to_fp16 on the 910A)
PRECISION_MODES = ("allow_fp32_to_fp16", "must_keep_origin_dtype")
#: torch_npu's ``_CubeMathType`` ([PT] npu_config.py; ASCEND-FACTS.md 13.1)
CUBE_MATH_TYPES = {"KEEP_DTYPE": 0, "ALLOW_FP32_DOWN_PRECISION": 1, "USE_FP16": 2, "USE_HF32": 3,
                   "USE_FP32_ADD": 4, "FORCE_GRP_ACC_FOR_FP32": 4}
#: torch_npu's deterministic levels (set_deterministic_level; ASCEND-FACTS.md 13.7)
DETERMINISTIC_LEVELS = (0, 1, 2, 3)
#: autocast dtypes of torch_npu (ASCEND-FACTS.md 13.2: fp16 by default, bf16 from the 910B1 on)
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)

#: where a value came from when nothing set it
DEFAULT_SOURCE = "default"


def _bool(name, value):
    if not isinstance(value, bool):
        raise AscendEmuError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass
class NpuOptions:
    """The torch_npu switches of one emulated run; change them with :meth:`set` (validated, source recorded).

    ``precision_mode`` None means the SoC's default (:attr:`effective_precision_mode`); ``cube_math_type``
    None means derived per call from ``allow_hf32`` and the precision mode (torch_npu's GetCubeMathType);
    ``deterministic_level`` 0 with ``deterministic`` True runs at level 1 (torch_npu takes max(1, level)).
    """

    soc: str = "Ascend910B"
    precision_mode: str | None = None
    allow_hf32_matmul: bool = False
    allow_hf32_conv: bool = True
    cube_math_type: int | None = None
    compatible_impl: bool = False
    deterministic: bool = False
    deterministic_level: int = 0
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype = torch.float16
    sources: dict = field(default_factory=dict)

    def __post_init__(self):
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}
        for name, value in given.items():
            # validate the constructor's values the same way as set()'s (soc first: autocast reads it)
            object.__setattr__(self, name, self._check(name, value, given))
        self._check_autocast({f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"})
        for name in given:
            self.sources.setdefault(name, DEFAULT_SOURCE)

    # -- validation ---------------------------------------------------------------------------------------
    def _check(self, name, value, state):
        if name == "soc":
            return soc_name(value)
        if name == "precision_mode":
            if value is not None and value not in PRECISION_MODES:
                raise AscendEmuError(f"unknown ACL_PRECISION_MODE {value!r}; torch_npu accepts "
                                     f"{' or '.join(PRECISION_MODES)} (None: the SoC's default)")
            return value
        if name == "cube_math_type":
            if value is None:
                return None
            if isinstance(value, str) and value.upper() in CUBE_MATH_TYPES:
                return CUBE_MATH_TYPES[value.upper()]
            code = getattr(value, "value", value)  # an enum member of the shim's CubeMathType
            if isinstance(code, bool) or not isinstance(code, int) or code not in CUBE_MATH_TYPES.values():
                raise AscendEmuError(f"unknown cube_math_type {value!r}; choose one of: "
                                     f"{', '.join(f'{k} ({v})' for k, v in CUBE_MATH_TYPES.items())} or None")
            return int(code)
        if name == "deterministic_level":
            if isinstance(value, bool) or value not in DETERMINISTIC_LEVELS:
                raise AscendEmuError(f"deterministic_level must be one of {DETERMINISTIC_LEVELS}, got {value!r}")
            return int(value)
        if name == "autocast_dtype":
            dtype = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                     "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}.get(value, value) \
                if isinstance(value, str) else value
            if dtype not in AUTOCAST_DTYPES:
                raise AscendEmuError(f"autocast dtype {value!r} is not one of torch_npu's: torch.float16, "
                                     f"torch.bfloat16")
            return dtype
        if name in ("allow_hf32_matmul", "allow_hf32_conv", "compatible_impl", "deterministic",
                    "autocast_enabled"):
            return _bool(name, value)
        raise AscendEmuError(f"unknown torch_npu option {name!r}; choose one of: "
                             f"{', '.join(f.name for f in fields(self) if f.name != 'sources')}")

    def _check_autocast(self, state):
        """bf16 autocast needs a vector unit with bf16: torch_npu refuses it below the 910B1 (13.2)."""
        if state["autocast_enabled"] and state["autocast_dtype"] == torch.bfloat16 \
                and not SOCS[state["soc"]].supports_bf16:
            raise AscendEmuError(f"bf16 autocast is not supported on {state['soc']} (torch_npu allows bfloat16 "
                                 f"from the Ascend910B on); use dtype=torch.float16 or an A2/A3 SoC")

    def set(self, name: str, value, source: str):
        """Set option ``name`` to ``value`` (validated; a bad value raises one line) and record ``source``."""
        value = self._check(name, value, None)
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}
        state[name] = value
        self._check_autocast(state)
        object.__setattr__(self, name, value)
        self.sources[name] = str(source)
        return value

    def __setattr__(self, name, value):
        # plain attribute writes go through set() so nothing bypasses validation or the sources record
        if name != "sources" and "sources" in self.__dict__ and name in self.__dataclass_fields__:
            self.set(name, value, "attribute")
        else:
            object.__setattr__(self, name, value)

    # -- derived values ----------------------------------------------------------------------------------
    @property
    def effective_precision_mode(self) -> str:
        """ACL_PRECISION_MODE as torch_npu runs it: the set value, else the SoC's default (13.1)."""
        if self.precision_mode is not None:
            return self.precision_mode
        return SOCS[self.soc].train_precision_default

    @property
    def effective_deterministic_level(self) -> int:
        """torch_npu's snapshot: max(1, level) when deterministic, else 0 (13.7)."""
        return max(1, self.deterministic_level) if self.deterministic else 0

    @contextlib.contextmanager
    def overridden(self, source: str, **values):
        """Set ``values`` for the duration of a ``with`` block (autocast regions), then restore them."""
        saved = {k: (getattr(self, k), self.sources.get(k, DEFAULT_SOURCE)) for k in values}
        try:
            for k, v in values.items():
                self.set(k, v, source)
            yield self
        finally:
            for k, (v, src) in saved.items():
                object.__setattr__(self, k, v)
                self.sources[k] = src

    def as_dict(self) -> dict:
        """The options as plain values (the run's record): torch dtypes by name."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}
        out["autocast_dtype"] = str(out["autocast_dtype"]).replace("torch.", "")
        out["effective_precision_mode"] = self.effective_precision_mode
        out["effective_deterministic_level"] = self.effective_deterministic_level
        out["sources"] = dict(self.sources)
        return out


# the options of the run inside whose ``with`` block the script is (a stack: runs may nest)
_ACTIVE: list = []


def current() -> NpuOptions | None:
    """The active emulated run's options, or None outside ``ae.torch.emulate``."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def activate(options: NpuOptions):
    """Make ``options`` the ones :func:`current` returns for the duration of a run."""
    _ACTIVE.append(options)
    try:
        yield options
    finally:
        _ACTIVE.remove(options)
