"""Output shapes of the data-movement ops against tf.raw_ops, on the attribute combinations
that produce 0-d and 1-d results (where a rank is easily lost), and grouped convolutions."""
import numpy as np
import pytest

from ascend_emu.frontend.tf.tf import import_tf
from ascend_emu.ops import OpContext, run_op

tf = import_tf()
rng = np.random.default_rng(7)
V = np.arange(4, dtype=np.int32) + 10          # a Shape output, as Flatten slices it
M = rng.standard_normal((3, 4)).astype(np.float32)
T3 = rng.standard_normal((2, 3, 4)).astype(np.float32)

# (input, begin, end, strides, masks): StridedSlice cases whose result has rank 0 or loses/gains axes
STRIDED = [
    (V, [0], [1], [1], dict(shrink_axis_mask=1)),                         # Flatten's batch dim: a scalar
    (V, [-1], [0], [1], dict(shrink_axis_mask=1)),                        # last element
    (V, [1], [3], [1], dict()),                                           # a 1-d slice stays 1-d
    (V, [0], [1], [1], dict(new_axis_mask=1)),                            # a new axis
    (M, [1, 2], [2, 3], [1, 1], dict(shrink_axis_mask=3)),                 # both axes shrunk: 0-d
    (M, [1, 0], [2, 0], [1, 1], dict(shrink_axis_mask=1, end_mask=2)),     # a row
    (M, [0, 2], [0, 3], [1, 1], dict(begin_mask=1, end_mask=1, shrink_axis_mask=2)),   # a column
    (T3, [0, 1], [0, 2], [1, 1], dict(ellipsis_mask=1, shrink_axis_mask=2)),           # ..., 1
    (T3, [1, 0, 0], [2, 0, 0], [1, 1, 1], dict(shrink_axis_mask=1, begin_mask=6, end_mask=6)),
    (T3, [0, 0, 0, 3], [0, 0, 0, 4], [1, 1, 1, 1],
     dict(new_axis_mask=1, begin_mask=6, end_mask=6, shrink_axis_mask=8)),
]


@pytest.mark.parametrize("case", range(len(STRIDED)))
def test_strided_slice_shape_and_values_match_tensorflow(case):
    x, b, e, s, masks = STRIDED[case]
    b, e, s = (np.array(v, np.int32) for v in (b, e, s))
    ref = tf.raw_ops.StridedSlice(input=x, begin=b, end=e, strides=s, **masks).numpy()
    (ours,) = run_op("StridedSlice", x, b, e, s, **masks)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("op, args, attrs, tf_kw", [
    ("Unpack", (V,), {"num": 4, "axis": 0}, {"value": V, "num": 4, "axis": 0}),
    ("Unpack", (M,), {"num": 4, "axis": 1}, {"value": M, "num": 4, "axis": 1}),
    ("BroadcastTo", (np.float32(2.5), np.array([], np.int32)), {},
     {"input": np.float32(2.5), "shape": np.array([], np.int32)}),
    ("Transpose", (np.float32(3.0), np.array([], np.int32)), {},
     {"x": np.float32(3.0), "perm": np.array([], np.int32)}),
    ("Slice", (V, np.array([2], np.int32), np.array([1], np.int32)), {},
     {"input": V, "begin": np.array([2], np.int32), "size": np.array([1], np.int32)}),
    ("Squeeze", (np.ones((1, 1), np.float32),), {}, {"input": np.ones((1, 1), np.float32)}),
])
def test_rank_kept_on_scalar_results(op, args, attrs, tf_kw):
    ref = getattr(tf.raw_ops, op)(**tf_kw)
    ref = [r.numpy() for r in ref] if isinstance(ref, list) else [ref.numpy()]
    ours = run_op(op, *[np.asarray(a) for a in args], **attrs)
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.shape == r.shape and o.dtype == r.dtype, (op, o.shape, r.shape)
        np.testing.assert_array_equal(o, r)


@pytest.mark.parametrize("cin, cin_g, cout", [(6, 1, 6), (4, 1, 8), (6, 2, 9), (8, 4, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_grouped_conv2d_matches_tensorflow(cin, cin_g, cout, dtype):
    """Keras Conv2D(groups=G) gives a Conv2D whose filter has cin/G input channels."""
    x = rng.standard_normal((1, 7, 6, cin)).astype(np.float16).astype(np.float32)
    w = rng.standard_normal((3, 3, cin_g, cout)).astype(np.float16).astype(np.float32)
    ref = tf.nn.conv2d(x, w, strides=[1, 2, 1, 1], padding="SAME").numpy()
    (ours,) = run_op("Conv2D", x.astype(dtype), w.astype(dtype), ctx=OpContext(dtype=dtype),
                     strides=[1, 2, 1, 1], padding="SAME")
    assert ours.shape == ref.shape and ours.dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == "float32" else 4 * 2 ** -10
    np.testing.assert_allclose(ours.astype(np.float32), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_grouped_conv2d_refuses_channels_that_do_not_split():
    from ascend_emu.errors import AscendEmuError

    with pytest.raises(AscendEmuError, match="whole number of groups"):
        run_op("Conv2D", np.ones((1, 4, 4, 5), np.float32), np.ones((3, 3, 2, 4), np.float32), padding="SAME")
