"""Issue 36's AI Core ops (ops/index_ops.py, ops/volume_ops.py, GatherV2's batch_dims): their attribute variants
against TensorFlow in float32 (bit for bit where the op's float32 arithmetic is TF's; Conv3D and AvgPool3D to
cosine >= 0.99999: their sums run in another order), and their fp16 behaviour against independent oracles written
from the documented arithmetic (NUMERICS.md section 2, "index and resize ops"; section 3 for Conv3D): plain
Python loops over float32 scalars, rounded to fp16 by tests/naive.py's cast, and tests/naive_cube.py's dot."""
import itertools

import numpy as np
import pytest

import naive
import naive_cube
from ascend_emu.numerics.policy import CubeModel
from ascend_emu.ops import OpContext, run_op

rng = np.random.default_rng(36)


def f(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    w = {2: np.uint16, 4: np.uint32}.get(a.dtype.itemsize)
    np.testing.assert_array_equal(a.view(w) if a.dtype.kind == "f" else a, b.view(w) if b.dtype.kind == "f" else b)


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def to16(v32) -> np.ndarray:
    """float32 values rounded once to fp16 by the independent cast of tests/naive.py."""
    return naive.cast_bits(np.asarray(v32, np.float32), "float16")[0].view(np.float16)


F16 = OpContext(dtype="float16")


# ------------------------------------------------------------------------- float32 against TensorFlow

RESIZE = [(ac, hp, size) for ac, hp in ((False, False), (True, False), (False, True)) for size in ((13, 5), (4, 17))]


@pytest.mark.parametrize("ac,hp,size", RESIZE)
def test_resize_ops_float32_bit_for_bit(ac, hp, size):
    import tensorflow as tf

    x, g = f(2, 7, 9, 3), f(2, *size, 3)
    kw = dict(align_corners=ac, half_pixel_centers=hp)
    s = np.array(size, np.int32)
    bits_equal(run_op("ResizeBilinear", x, s, **kw)[0], tf.raw_ops.ResizeBilinear(images=x, size=size, **kw).numpy())
    bits_equal(run_op("ResizeNearestNeighbor", x, s, **kw)[0],
               tf.raw_ops.ResizeNearestNeighbor(images=x, size=size, **kw).numpy())
    bits_equal(run_op("ResizeBilinearGrad", g, x, **kw)[0],
               tf.raw_ops.ResizeBilinearGrad(grads=g, original_image=x, **kw).numpy())
    bits_equal(run_op("ResizeNearestNeighborGrad", g, np.array((7, 9), np.int32), **kw)[0],
               tf.raw_ops.ResizeNearestNeighborGrad(grads=g, size=(7, 9), **kw).numpy())


def test_scan_select_gather_scatter_float32_bit_for_bit():
    import tensorflow as tf

    c = f(4, 50, 6)
    for ex, rv, ax in itertools.product((False, True), (False, True), (0, 1, -1)):
        bits_equal(run_op("Cumsum", c, np.int32(ax), exclusive=ex, reverse=rv)[0],
                   tf.raw_ops.Cumsum(x=c, axis=ax, exclusive=ex, reverse=rv).numpy())
    t = np.round(f(5, 20), 1)      # ties: the lower index first
    t[1, 3], t[1, 7], t[2, :4] = 0.0, -0.0, np.inf
    for k in (0, 3, 20):
        ours, ref = run_op("TopKV2", t, np.int32(k)), tf.raw_ops.TopKV2(input=t, k=k)
        bits_equal(ours[0], ref[0].numpy())
        bits_equal(ours[1], ref[1].numpy())
    p = f(3, 4, 6, 2)
    for bd, ax, ishape in ((1, 2, (3, 5)), (2, 2, (3, 4, 5)), (1, 1, (3, 2, 2)), (-1, 2, (3, 4, 5))):
        ind = rng.integers(0, p.shape[ax], ishape).astype(np.int32)
        bits_equal(run_op("GatherV2", p, ind, np.int32(ax), batch_dims=bd)[0],
                   tf.raw_ops.GatherV2(params=p, indices=ind, axis=ax, batch_dims=bd).numpy())
    d, ids = f(40, 5), np.sort(rng.integers(0, 8, 40)).astype(np.int32)
    bits_equal(run_op("SegmentSum", d, ids)[0], tf.raw_ops.SegmentSum(data=d, segment_ids=ids).numpy())
    ind, u, tt = rng.integers(0, 4, (30, 2)).astype(np.int32), f(30, 3), f(4, 4, 3)   # repeated indices
    bits_equal(run_op("ScatterNd", ind, u, np.array([4, 4, 3], np.int32))[0],
               tf.raw_ops.ScatterNd(indices=ind, updates=u, shape=[4, 4, 3]).numpy())
    bits_equal(run_op("TensorScatterAdd", tt, ind, u)[0],
               tf.raw_ops.TensorScatterAdd(tensor=tt, indices=ind, updates=u).numpy())
    once = np.unique(ind, axis=0)
    bits_equal(run_op("TensorScatterUpdate", tt, once, u[:len(once)])[0],
               tf.raw_ops.TensorScatterUpdate(tensor=tt, indices=once, updates=u[:len(once)]).numpy())


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_volume_ops_float32(padding):
    """MaxPool3D bit for bit; AvgPool3D (our sum is exact, TF's float32) and Conv3D (the cube's K order and block
    sums) to cosine >= 0.99999."""
    import tensorflow as tf

    v, w = f(2, 6, 7, 8, 3), f(2, 3, 3, 3, 5)
    for ks, st in (([1, 2, 3, 2, 1], [1, 2, 2, 2, 1]), ([1, 3, 3, 3, 1], [1, 1, 2, 1, 1])):
        kw = dict(ksize=ks, strides=st, padding=padding)
        bits_equal(run_op("MaxPool3D", v, **kw)[0], tf.raw_ops.MaxPool3D(input=v, **kw).numpy())
        ours, ref = run_op("AvgPool3D", v, **kw)[0], tf.raw_ops.AvgPool3D(input=v, **kw).numpy()
        assert ours.shape == ref.shape and cosine(ours, ref) >= 0.99999
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    for st in ([1, 1, 1, 1, 1], [1, 2, 1, 2, 1]):
        ref = tf.raw_ops.Conv3D(input=v, filter=w, strides=st, padding=padding).numpy()
        ours = run_op("Conv3D", v, w, strides=st, padding=padding)[0]
        assert ours.shape == ref.shape and ours.dtype == np.float32 and cosine(ours, ref) >= 0.99999


# ------------------------------------------------------------------------- fp16 against oracles

def test_fp16_cumsum_topk_match_their_oracles():
    x = f(3, 40, scale=30).astype(np.float16)
    for ex, rv in itertools.product((False, True), (False, True)):
        want = np.empty(x.shape, np.float32)
        for r in range(x.shape[0]):
            acc = np.float32(0)
            cols = range(x.shape[1] - 1, -1, -1) if rv else range(x.shape[1])
            for c in cols:     # one float32 add per step, each output rounded once
                if ex:
                    want[r, c] = acc
                acc = np.float32(acc + np.float32(x[r, c]))
                if not ex:
                    want[r, c] = acc
        # the float32 model (op_model ascendc / exact); TBE's fp16 running sum is tests/ops/test_sum_kernels.py's
        bits_equal(run_op("Cumsum", x, np.int32(1), exclusive=ex, reverse=rv,
                          ctx=OpContext(dtype="float16", op_model="ascendc"))[0], to16(want))
    # a running sum beyond fp16's range overflows: status 0x20
    ctx = OpContext(dtype="float16")
    (big,) = run_op("Cumsum", np.full(8, 30000, np.float16), np.int32(0), ctx=ctx)
    assert np.isinf(big[-1]) and big[1] == 60000 and ctx.status & 0x20
    t = f(4, 30).astype(np.float16)
    t[0, :10] = t[0, 10:20]           # ties of fp16 values
    vals, idx = run_op("TopKV2", t, np.int32(7), ctx=OpContext(dtype="float16"))
    for r in range(t.shape[0]):
        want = sorted(range(t.shape[1]), key=lambda i: (-float(t[r, i]), i))[:7]
        assert idx[r].tolist() == want
        bits_equal(vals[r], t[r, want])


def _bilinear_oracle(x16, oh, ow, ac, hp):
    """TF's bilinear formula on float32 scalars, written out per pixel."""
    n, h, w, c = x16.shape

    def coords(n_in, n_out):
        sc = np.float32(n_in - 1) / np.float32(n_out - 1) if ac and n_out > 1 else np.float32(n_in) / np.float32(n_out)
        out = []
        for i in range(n_out):
            s = np.float32(np.float32(np.float32(i) + np.float32(0.5)) * sc) - np.float32(0.5) if hp \
                else np.float32(np.float32(i) * sc)
            lo = int(np.floor(s))
            out.append((max(lo, 0), min(int(np.ceil(s)), n_in - 1), np.float32(s - np.float32(lo))))
        return out

    ys, xs = coords(h, oh), coords(w, ow)
    y = np.empty((n, oh, ow, c), np.float32)
    for b, (i, (t, bt, dy)), (j, (le, r, dx)), ch in itertools.product(range(n), enumerate(ys), enumerate(xs),
                                                                      range(c)):
        g = lambda a, e: np.float32(x16[b, a, e, ch])   # noqa: E731
        top = np.float32(g(t, le) + np.float32(np.float32(g(t, r) - g(t, le)) * dx))
        bot = np.float32(g(bt, le) + np.float32(np.float32(g(bt, r) - g(bt, le)) * dx))
        y[b, i, j, ch] = np.float32(top + np.float32(np.float32(bot - top) * dy))
    return to16(y)


@pytest.mark.parametrize("ac,hp", [(False, False), (True, False), (False, True)])
def test_fp16_resize_matches_its_oracle(ac, hp):
    x = f(1, 5, 6, 2, scale=4).astype(np.float16)
    bits_equal(run_op("ResizeBilinear", x, np.array([7, 4], np.int32), align_corners=ac, half_pixel_centers=hp,
                      ctx=OpContext(dtype="float16"))[0], _bilinear_oracle(x, 7, 4, ac, hp))
    # nearest neighbour picks input pixels: the fp16 output is the float32 one's exact narrowing
    nn16 = run_op("ResizeNearestNeighbor", x, np.array([9, 3], np.int32), align_corners=ac, half_pixel_centers=hp,
                  ctx=OpContext(dtype="float16"))[0]
    nn32 = run_op("ResizeNearestNeighbor", x.astype(np.float32), np.array([9, 3], np.int32), align_corners=ac,
                  half_pixel_centers=hp)[0]
    bits_equal(nn16, nn32.astype(np.float16))


def test_fp16_segment_and_scatter_sums_match_their_oracle():
    d = f(30, 4, scale=100).astype(np.float16)
    ids = np.sort(rng.integers(0, 6, 30)).astype(np.int32)
    ind = rng.integers(0, 6, (30, 1)).astype(np.int32)
    base = f(6, 4, scale=100).astype(np.float16)
    seg = np.zeros((int(ids[-1]) + 1, 4), np.float32)
    sc = np.zeros((6, 4), np.float32)
    add = base.copy()
    for r in range(30):                 # float32 adds in row order, each output rounded once
        for c in range(4):
            seg[ids[r], c] = np.float32(seg[ids[r], c] + np.float32(d[r, c]))
            sc[ind[r, 0], c] = np.float32(sc[ind[r, 0], c] + np.float32(d[r, c]))
            # TensorScatterAdd (ScatterNdAdd): each add in fp16, the exact sum rounded once
            add[ind[r, 0], c] = np.float16(np.float64(add[ind[r, 0], c]) + np.float64(d[r, c]))
    bits_equal(run_op("SegmentSum", d, ids, ctx=OpContext(dtype="float16"))[0], to16(seg))
    bits_equal(run_op("ScatterNd", ind, d, np.array([6, 4], np.int32), ctx=OpContext(dtype="float16"))[0], to16(sc))
    bits_equal(run_op("TensorScatterAdd", base, ind, d, ctx=OpContext(dtype="float16"))[0], add)


@pytest.mark.parametrize("out", ["float16", "float32"])
@pytest.mark.parametrize("order", ["hwc", "c1hwc0"])
def test_fp16_conv3d_is_the_cube_model_over_its_k_order(order, out):
    """Each output voxel is one naive_cube dot over its patch in the K order (kd, kh, kw, c) or
    (kd, c // 16, kh, kw, c % 16), zero-padded; bias-free, converted once by the fixpipe (fp16 out, or float32 out
    as under cube_fp16in_fp32out, where the two orders give different bits: 31 of these 48 outputs)."""
    model = CubeModel(conv_k_order=order)
    x, w = f(1, 3, 4, 4, 3).astype(np.float16), f(2, 2, 3, 3, 2).astype(np.float16)
    st, pads = (1, 2, 1), ((0, 1), (0, 0), (1, 1))     # SAME for these shapes
    got = run_op("Conv3D", x, w, strides=[1, *st, 1], padding="SAME",
                 ctx=OpContext(dtype="float16", cube_out=out, cube_model=model))[0]
    xp = np.pad(x.astype(np.float64), [(0, 0), *pads, (0, 0)])
    od, oh, ow = got.shape[1:4]
    kd, kh, kw, c, co = w.shape
    cp = 16 if order == "c1hwc0" else c
    acc = np.empty(got.shape)
    kwargs = naive_cube.model_kwargs(model)
    for o in itertools.product(range(od), range(oh), range(ow), range(co)):
        terms = {}
        for a, b, e, ch in itertools.product(range(kd), range(kh), range(kw), range(cp)):
            xv = xp[0, o[0] * st[0] + a, o[1] * st[1] + b, o[2] * st[2] + e, ch] if ch < c else 0.0
            wv = float(w[a, b, e, ch, o[3]]) if ch < c else 0.0
            key = (a, b, e, ch) if order == "hwc" else (a, ch // 16, b, e, ch % 16)
            terms[key] = (xv, wv)
        keys = sorted(terms)
        acc[(0, *o)] = naive_cube.dot([terms[k][0] for k in keys], [terms[k][1] for k in keys], 0.0, **kwargs)
    want, _ = naive_cube.finish(acc, out)
    bits_equal(got, want)


def test_fp16_pools_3d():
    v = f(1, 4, 5, 5, 2, scale=50).astype(np.float16)
    kw = dict(ksize=[1, 2, 3, 3, 1], strides=[1, 2, 2, 2, 1], padding="SAME")
    mx = run_op("MaxPool3D", v, ctx=OpContext(dtype="float16"), **kw)[0]
    av = run_op("AvgPool3D", v, ctx=OpContext(dtype="float16"), **kw)[0]
    # SAME: depth 4 -> 2 (no pad), 5 -> 3 (window 3, stride 2: one voxel on each side)
    want_mx, want_av = np.empty(mx.shape, np.float16), np.empty(av.shape)
    for d, i, j, ch in itertools.product(range(2), range(3), range(3), range(2)):
        win = [float(v[0, d * 2 + a, y, x, ch]) for a in range(2) for y in range(i * 2 - 1, i * 2 + 2)
               for x in range(j * 2 - 1, j * 2 + 2) if 0 <= y < 5 and 0 <= x < 5]
        want_mx[0, d, i, j, ch] = max(win)
        want_av[0, d, i, j, ch] = sum(win) / len(win)   # exact in float64 for these few fp16 values
    bits_equal(mx, want_mx)
    bits_equal(av, naive.round_f64(want_av, "float16")[0].view(np.float16))


@pytest.mark.parametrize("padding,st", [("SAME", (1, 2, 2)), ("VALID", (2, 1, 2)), ("SAME", (2, 2, 1))])
def test_conv3d_gradients_float32(padding, st):
    """Conv3DBackpropInputV2 / FilterV2 against TF's float32 kernels (another summation order: cosine)."""
    import tensorflow as tf

    x, w = f(2, 5, 6, 7, 3), f(2, 3, 2, 3, 4)
    kw = dict(strides=[1, *st, 1], padding=padding)
    y = tf.raw_ops.Conv3D(input=x, filter=w, **kw).numpy()
    dy = f(*y.shape)
    ref = tf.raw_ops.Conv3DBackpropInputV2(input_sizes=x.shape, filter=w, out_backprop=dy, **kw).numpy()
    ours = run_op("Conv3DBackpropInputV2", np.array(x.shape, np.int32), w, dy, **kw)[0]
    assert ours.shape == ref.shape and cosine(ours, ref) >= 0.99999
    ref = tf.raw_ops.Conv3DBackpropFilterV2(input=x, filter_sizes=w.shape, out_backprop=dy, **kw).numpy()
    ours = run_op("Conv3DBackpropFilterV2", x, np.array(w.shape, np.int32), dy, **kw)[0]
    assert ours.shape == ref.shape and cosine(ours, ref) >= 0.99999


def test_fp16_conv3d_backprop_input_is_the_cube_model_over_the_zero_inserted_dy():
    """Each dx voxel is one naive_cube dot over (kd, kh, kw, cout) of the zero-inserted, padded dy (the inserted
    and padded zeros are +0 products) times the rotated filter; float32 out (cube_fp16in_fp32out)."""
    x_shape, w = (1, 4, 5, 4, 2), f(2, 3, 2, 2, 3).astype(np.float16)
    st, pads = (2, 2, 1), ((0, 0), (1, 1), (0, 1))           # SAME: out (2, 3, 4)
    dy = f(1, 2, 3, 4, 3).astype(np.float16)
    got = run_op("Conv3DBackpropInputV2", np.array(x_shape, np.int32), w, dy, strides=[1, *st, 1], padding="SAME",
                 ctx=OpContext(dtype="float16", cube_out="float32"))[0]
    kd, kh, kw, c, co = w.shape
    acc = np.empty(x_shape)
    for n, z, y, x_, ch in itertools.product(*map(range, x_shape)):
        av, bv = [], []
        for a, b, e, o in itertools.product(range(kd), range(kh), range(kw), range(co)):
            # the forward output voxel whose tap (kd-1-a, ...) reads input (z, y, x_)
            pos = [z + pads[0][0] - (kd - 1 - a), y + pads[1][0] - (kh - 1 - b), x_ + pads[2][0] - (kw - 1 - e)]
            ok = all(p % s == 0 and 0 <= p // s < dy.shape[1 + i] for i, (p, s) in enumerate(zip(pos, st)))
            av.append(float(dy[n, pos[0] // st[0], pos[1] // st[1], pos[2] // st[2], o]) if ok else 0.0)
            bv.append(float(w[kd - 1 - a, kh - 1 - b, kw - 1 - e, ch, o]))
        acc[n, z, y, x_, ch] = naive_cube.dot(av, bv, 0.0)
    want, _ = naive_cube.finish(acc, "float32")
    bits_equal(got, want)


def test_pool3d_gradients_float32_and_fp16():
    """MaxPool3DGrad and AvgPool3DGrad against TF in float32 on tie-free inputs (float32 adds in another order where
    windows overlap: cosine), and in fp16 on inputs with ties against a scalar loop: MaxPool3DGrad as the TBE
    kernel (max_pool3d_grad.py): each window's gradient to its first tie in (kd, kh, kw) order, the gradients of a
    voxel added in float32 by output depth row and then by winning tap; AvgPool3DGrad float32 adds in output order;
    each input voxel rounded once."""
    import tensorflow as tf

    kw = dict(ksize=[1, 2, 3, 3, 1], strides=[1, 1, 2, 2, 1], padding="SAME")
    xt = f(1, 4, 5, 5, 2)
    assert np.unique(xt).size == xt.size
    yt = tf.raw_ops.MaxPool3D(input=xt, **kw).numpy()
    gt = f(*yt.shape, scale=100)
    for op, args, tf_args in (("MaxPool3DGrad", (xt, yt, gt), dict(orig_input=xt, orig_output=yt, grad=gt)),
                              ("AvgPool3DGrad", (np.array(xt.shape, np.int32), gt),
                               dict(orig_input_shape=xt.shape, grad=gt))):
        ref = getattr(tf.raw_ops, op)(**tf_args, **kw).numpy()
        ours = run_op(op, *args, **kw)[0]
        assert cosine(ours, ref) >= 0.99999 and np.allclose(ours, ref, rtol=1e-5, atol=1e-5)
    x = f(1, 4, 5, 5, 2).round(1)                # ties
    y = tf.raw_ops.MaxPool3D(input=x, **kw).numpy()
    g = f(*y.shape, scale=100)
    x16, y16, g16 = x.astype(np.float16), y.astype(np.float16), g.astype(np.float16)
    mx, av = np.zeros(x.shape, np.float32), np.zeros(x.shape, np.float32)
    picks = []
    for o in np.ndindex(*y.shape[1:4]):          # SAME here: pad (0, 1) in depth, (1, 1) in height and width
        lo = (o[0], o[1] * 2 - 1, o[2] * 2 - 1)
        taps = [(t, (d, h, w)) for t, (d, h, w) in enumerate((d, h, w) for d in range(lo[0], lo[0] + 2)
                                                             for h in range(lo[1], lo[1] + 3)
                                                             for w in range(lo[2], lo[2] + 3))
                if d < 4 and 0 <= h < 5 and 0 <= w < 5]
        for c in range(2):
            gv = np.float32(g16[(0, *o, c)])
            share = np.float32(gv / np.float32(len(taps)))
            for _, v in taps:
                av[(0, *v, c)] = np.float32(av[(0, *v, c)] + share)
            tie = [(t, v) for t, v in taps if x16[(0, *v, c)] == y16[(0, *o, c)]]
            if tie:
                picks.append(((o[0], tie[0][0]), tie[0][1], c, gv))
    for _, v, c, gv in sorted(picks, key=lambda e: e[0]):       # by output depth row, then tap
        mx[(0, *v, c)] = np.float32(mx[(0, *v, c)] + gv)
    bits_equal(run_op("MaxPool3DGrad", x16, y16, g16, ctx=OpContext(dtype="float16"), **kw)[0], to16(mx))
    bits_equal(run_op("AvgPool3DGrad", np.array(x.shape, np.int32), g16, ctx=OpContext(dtype="float16"), **kw)[0],
               to16(av))


def test_max_pool3d_grad_gives_each_window_one_tie():
    """A window of equal values: the TBE kernel's mask keeps only its first tap, where TF's CPU kernel gives the
    gradient to every tie."""
    x = np.ones((1, 2, 2, 2, 1), np.float32)
    (dx,) = run_op("MaxPool3DGrad", x, np.ones((1, 1, 1, 1, 1), np.float32), np.full((1, 1, 1, 1, 1), 3, np.float32),
                   ksize=[1, 2, 2, 2, 1], strides=[1, 2, 2, 2, 1], padding="VALID")
    assert dx[0, 0, 0, 0, 0] == 3 and dx.sum() == 3


def test_gather_nd_bit_for_bit():
    """GatherNd (ONNX's GatherND): TensorFlow's own GatherNd on indices of depth 0..rank; a negative index counts
    from the end (ONNX's rule), compared with TensorFlow on its positive form; out of range is an error."""
    import tensorflow as tf

    p = f(3, 4, 5)
    for ishape in ((6, 1), (2, 3, 2), (4, 3), (2, 0)):
        depth = ishape[-1]
        ind = np.stack([rng.integers(0, p.shape[k], ishape[:-1]) for k in range(depth)], -1).astype(np.int64) \
            if depth else np.zeros(ishape, np.int64)
        bits_equal(run_op("GatherNd", p, ind)[0], tf.raw_ops.GatherNd(params=p, indices=ind).numpy())
        if depth:
            neg = ind - np.asarray(p.shape[:depth])
            bits_equal(run_op("GatherNd", p, neg)[0], tf.raw_ops.GatherNd(params=p, indices=ind).numpy())
    with pytest.raises(Exception, match="outside"):
        run_op("GatherNd", p, np.asarray([[3]], np.int64))
