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


def assert_float32_outputs(op, ours, ref, n, exact: bool, rtol: float, atol: float, bool_as_any: bool = False):
    """The first ``n`` outputs of an op in float32 compute against TensorFlow's: same shapes; integer and
    ``exact`` outputs equal bit for bit in TF's dtype (``bool_as_any``: a TF bool output may come as our
    integer); float outputs float32 within ``rtol``/``atol``."""
    assert len(ours) >= n
    for o, r in zip(ours[:n], ref[:n]):
        assert o.shape == r.shape, (op, o.shape, r.shape)
        if exact or r.dtype.kind in "biu":
            np.testing.assert_array_equal(o, r)
            assert o.dtype == r.dtype or (bool_as_any and r.dtype.kind == "b")
        else:
            assert o.dtype == np.float32
            np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
