"""Test data shared by the op tables of tests/ops (tests/ is on the path: pyproject's pythonpath)."""
import numpy as np


def fp16_exact(rng: np.random.Generator):
    """``f(*shape, lo=-2.0, hi=2.0)``: uniform float32 test data that is fp16-representable (so fp16 compute
    sees the same inputs as float32), drawn from ``rng``."""
    def f(*shape, lo=-2.0, hi=2.0):
        return rng.uniform(lo, hi, size=shape).astype(np.float16).astype(np.float32)
    return f


def i32(*v):
    return np.array(v, dtype=np.int32)
