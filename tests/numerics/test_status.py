"""The float status register: sticky OR of kernel statuses, get/clear/decode/tensor."""
from __future__ import annotations

import numpy as np

from ascend_emu import FloatStatus, decode_status
from ascend_emu.numerics import cast, vector


def test_sticky_or_get_clear():
    reg = FloatStatus()
    assert reg.get() == 0 and not reg and not reg.overflow
    _, st = cast(np.float32([1e6]), "float16")
    reg.record(st)
    _, st = vector("add", np.float16([1.0]), np.float16([2.0]))
    reg.record(st)  # a clean op does not clear earlier bits
    assert reg.get() == 0x100 and reg and int(reg) == 0x100
    _, st = vector("mul", np.float16([300.0]), np.float16([300.0]))
    assert reg.record(st) == 0x120
    assert reg.get() == 0x120  # reading does not clear
    reg.clear()
    assert reg.get() == 0 and not reg


def test_tensor_like_npu_get_float_status():
    reg = FloatStatus()
    t = reg.tensor()
    assert t.shape == (8,) and t.dtype == np.float32 and not t.any()
    reg.record(0x400)
    t = reg.tensor()
    assert t.any() and t[0] == 0x400


def test_decode():
    assert decode_status(0) == []
    names = decode_status(0x120)
    assert names == ["0x20 floating-point compute overflow (Inf/NaN produced or propagated)",
                     "0x100 FP32->FP16 (or int32->FP16) conversion overflow"]
    assert decode_status(0x1001)[-1] == "0x1001 unknown"
    reg = FloatStatus(0x400)
    assert reg.decode() == ["0x400 cube accumulation overflow"]
    assert "cube accumulation overflow" in repr(reg)
    assert repr(FloatStatus()) == "FloatStatus(0x0)"
