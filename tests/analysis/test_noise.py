"""Rounding noise of an exact 0 (analysis/noise.py): recognised for additive results only, with its bound, and passed
over by the first divergent op under ascend-emu's rules."""
import numpy as np

from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.dump import load_dump
from ascend_emu.analysis.noise import additive_terms

from test_compare import write

EPS32 = 2.0 ** -23


def centred(seed=0, rows=512, cols=8):
    """dy whose columns sum to 0 in exact arithmetic (a batch norm's gradient): float64 centring, then each
    column's float64 residue moved onto its first element, so the float32 values' exact sum is 0. The seeds the
    tests use give two summation orders whose cosine is below 0.9 (a failing row)."""
    r = np.random.default_rng(seed).standard_normal((rows, cols)) * 1e-2
    dy = (r - r.mean(axis=0)).astype(np.float32)
    dy[0] -= dy.astype(np.float64).sum(axis=0).astype(np.float32)
    assert np.all(np.abs(dy.astype(np.float64).sum(axis=0)) < 1e-9)
    return dy


def sums(dy):
    """Two float32 summation orders of the columns: first row to last, and last to first."""
    fwd = np.zeros(dy.shape[1], np.float32)
    bwd = np.zeros(dy.shape[1], np.float32)
    for row, back in zip(dy, dy[::-1]):
        fwd = (fwd + row).astype(np.float32)
        bwd = (bwd + back).astype(np.float32)
    return fwd, bwd


def dumps(tmp_path, dy, npu_out, bench_out, *, after=None, tf_type="BiasAddGrad"):
    """A producer of dy, the sum, a copy of it (and optionally a later op with its own values)."""
    def ops(out, later):
        out = np.asarray(out)
        o = [("dy", "FusedBatchNormGradV3", [], [dy]), ("db", tf_type, ["dy:0"], [out]),
             ("copy", "Identity", ["db:0"], [out.copy()])]
        if later is not None:
            o.append(("later", "Relu", ["dy:0"], [later]))
        return o
    n = write(tmp_path / "npu", "npu", ops(npu_out, None if after is None else after[0]))
    b = write(tmp_path / "bench", "bench", ops(bench_out, None if after is None else after[1]))
    return n, b


def test_a_cancelling_sum_is_noise_and_never_the_first_divergent_op(tmp_path):
    dy = centred()
    seq, pair = sums(dy)
    bound = dy.shape[0] * EPS32 * float(np.abs(dy).max())            # n x eps x the input's largest magnitude
    assert 0 < np.abs(seq).max() <= bound and 0 < np.abs(pair).max() <= bound and not np.array_equal(seq, pair)
    c = compare(*dumps(tmp_path, dy, seq, pair))
    row = c.rows_of("db")[0]
    assert row["Result"] == "error" and row["Cosine"] < 0.9          # the metric rule fails it ...
    assert "rounding noise" in row["Err_message"]
    assert c.noise_ops() == ["db"] and c.first_divergent() is None  # ... and the copy reading it is passed over
    assert c.rows_of("copy")[0]["Result"] == "error"
    assert "rounding noise" in c.summary_text() and "every op passes" not in c.summary_text()


def test_above_the_bound_is_an_error_where_it_enters(tmp_path):
    dy = centred(1)
    seq, pair = sums(dy)
    bound = dy.shape[0] * EPS32 * float(np.abs(dy).max())
    wrong = seq.copy()
    wrong[3] = np.float32(bound * 1.5)                                 # one channel beyond what rounding can make
    c = compare(*dumps(tmp_path, dy, wrong, pair))
    assert "rounding noise" not in c.rows_of("db")[0]["Err_message"]
    assert c.first_divergent().name == "db" and c.noise_ops() == []


def test_the_ops_passed_over_are_named_with_the_first_divergent_op(tmp_path):
    dy = centred(3)
    seq, pair = sums(dy)
    good = np.maximum(dy, 0)
    bad = good.copy()
    bad[5, 2] += 0.5
    c = compare(*dumps(tmp_path, dy, seq, pair, after=(bad, good)))
    d = c.first_divergent()
    assert d.name == "later" and d.noise == ["db"] and "rounding noise" in d.format_text()
    assert d.to_dict()["noise"] == ["db"]


def test_a_product_is_never_noise(tmp_path):
    # x * y with the large values of each meeting the small of the other: the results are tiny and exact, far below
    # eps x the inputs' largest magnitudes; a sum's bound would call them noise, a product's values are not
    x = np.array([1.0, 1e-10, 1.0, 1e-10], np.float32)
    y = np.array([1e-10, 1.0, 1e-10, 1.0], np.float32)
    prod = (x * y).astype(np.float32)
    other = prod * np.float32(-1)
    n = write(tmp_path / "npu", "npu", [("x", "Relu", [], [x]), ("y", "Relu", [], [y]),
                                        ("m", "Mul", ["x:0", "y:0"], [other])])
    b = write(tmp_path / "bench", "bench", [("x", "Relu", [], [x]), ("y", "Relu", [], [y]),
                                            ("m", "Mul", ["x:0", "y:0"], [prod])])
    c = compare(n, b)
    assert c.first_divergent().name == "m" and "rounding noise" not in c.rows_of("m")[0]["Err_message"]
    assert additive_terms(load_dump(n), load_dump(n).op("m"), 0) is None


def test_the_terms_of_each_additive_kind(tmp_path):
    a = np.ones((6, 4), np.float32)
    x4 = np.ones((2, 3, 5, 4), np.float32)
    ops = [("a", "Relu", [], [a]), ("b", "Relu", [], [a]), ("x4", "Relu", [], [x4]),
           ("s", "Sum", ["a:0"], [a.sum(0, keepdims=True)]), ("mean", "Mean", ["a:0"], [a.mean(0, keepdims=True)]),
           ("all", "Sum", ["a:0"], [np.float32(a.sum())]), ("lost", "Sum", ["x4:0"], [x4.sum((0, 1))]),
           ("add", "AddV2", ["a:0", "b:0"], [a + a]), ("n3", "AddN", ["a:0", "b:0", "a:0"], [3 * a]),
           ("bn", "FusedBatchNormGradV3", ["a:0", "b:0"], [a, a[0], a[0]]),
           ("bg", "BiasAddGrad", ["x4:0"], [x4.sum((0, 1, 2))]),
           ("bgc", "BiasAddGrad", ["x4:0"], [x4.sum((0, 2, 3))], {"attrs": {"data_format": "NCHW"}}),
           ("conv", "Conv2DBackpropFilter", ["x4:0", "b:0"], [a, x4.sum((0, 2, 3))],
            {"precision": {"aten": "aten.convolution_backward.default"}}),
           ("mm", "MatMul", ["a:0", "b:0"], [a])]
    d = load_dump(write(tmp_path / "d", "npu", ops))
    got = {(name, k): additive_terms(d, d.op(name), k) for name, k in
           [("s", 0), ("mean", 0), ("all", 0), ("lost", 0), ("add", 0), ("n3", 0), ("bn", 1), ("bn", 2), ("bg", 0),
            ("bgc", 0), ("conv", 0), ("conv", 1), ("mm", 0)]}
    assert got == {("s", 0): ("sum", (0,), ["a:0"]), ("mean", 0): ("mean", (0,), ["a:0"]),
                   ("all", 0): ("sum", (0, 1), ["a:0"]), ("lost", 0): None,   # which axes went: not in the shapes
                   ("add", 0): ("elementwise", 2, ["a:0", "b:0"]),
                   ("n3", 0): ("elementwise", 3, ["a:0", "b:0", "a:0"]),
                   ("bn", 1): None, ("bn", 2): ("sum", (0,), ["a:0"]),          # the scale gradient is a product
                   ("bg", 0): ("sum", (0, 1, 2), ["x4:0"]), ("bgc", 0): ("sum", (0, 2, 3), ["x4:0"]),
                   ("conv", 0): None, ("conv", 1): ("sum", (0, 2, 3), ["x4:0"]), ("mm", 0): None}


def test_the_bound_is_each_elements_own(tmp_path):
    # a - b where one position holds two large equal values: the tensor-wide largest input (1e6) would bound every
    # element by 2 x eps x 1e6 = 0.24; each element's own inputs (~1) bound it by 2.4e-7, so 0.1 against -0.1 is an
    # error where it enters, not noise
    a = np.array([1e6, 1, 2, 3], np.float32)
    b = np.array([1e6, .9, 1.9, 2.9], np.float32)
    good = (a - b).astype(np.float32)
    bad = np.array([0, -.1, .2, -.05], np.float32)
    ops = lambda out: [("a", "Relu", [], [a]), ("b", "Relu", [], [b]), ("d", "Sub", ["a:0", "b:0"], [out])]
    c = compare(write(tmp_path / "n", "npu", ops(bad)), write(tmp_path / "b", "bench", ops(good)))
    assert c.first_divergent().name == "d" and c.noise_ops() == []
    # and a channel whose terms are large does not lend its bound to the others: one large cancelling column
    dy = centred(0)
    dy[:, 0] *= 1e4
    seq, pair = sums(dy)
    own = dy.shape[0] * EPS32 * np.abs(dy).max(axis=0)
    assert np.all(np.abs(seq) <= own) and np.all(np.abs(pair) <= own)
    wrong = -pair                                   # cosine -1: the row fails
    wrong[1] = np.float32(own[1] * 3)               # 3x column 1's own bound, far below column 0's
    assert wrong[1] < own[0]
    c = compare(*dumps(tmp_path / "ch", dy, wrong, pair))
    assert c.rows_of("db")[0]["Result"] == "error" and c.first_divergent().name == "db"
    wrong[1] = -pair[1]                             # within its own bound again: noise
    c = compare(*dumps(tmp_path / "ch2", dy, wrong, pair))
    assert c.noise_ops() == ["db"]


def test_16_bit_and_mismatched_rows_are_not_judged_by_their_own_format(tmp_path):
    # an fp16 bench dump (two NPU dumps compared): the bound stays float32's, so an fp16-sized error is no noise
    dy = centred(0).astype(np.float16)
    n_out = dy.astype(np.float32).sum(0).astype(np.float16)
    n_out[2] = np.float16(1.0)
    b_out = -n_out
    c = compare(*dumps(tmp_path / "h", dy, n_out, b_out))
    assert c.first_divergent().name == "db" and c.noise_ops() == []
    # a shape mismatch is an error where it enters, never noise
    seq, pair = sums(centred(0))
    c = compare(*dumps(tmp_path / "s", centred(0), seq, pair[:4]))
    assert c.rows_of("db")[0]["Cosine"] == "N/A" and c.noise_ops() == [] and c.first_divergent().name == "db"


def test_msprobe_rules_keep_their_verdict(tmp_path):
    dy = centred(5)
    seq, pair = sums(dy)
    c = compare(*dumps(tmp_path, dy, seq, pair), rules="msprobe")
    assert "rounding noise" not in c.rows_of("db")[0]["Err_message"] and c.noise_ops() == []
    assert c.first_divergent() is not None


def test_an_input_not_in_the_dump_gives_no_bound(tmp_path):
    # a sum whose input is not in the dump: nothing bounds its rounding, so the rule does not apply
    dy = centred(6)
    seq, pair = sums(dy)
    n = write(tmp_path / "npu", "npu", [("db", "BiasAddGrad", ["missing:0"], [seq])])
    b = write(tmp_path / "bench", "bench", [("db", "BiasAddGrad", ["missing:0"], [pair])])
    c = compare(n, b)
    assert c.noise_ops() == [] and c.first_divergent().name == "db"


def test_a_keras_convolutions_bias_gradient_before_a_batch_norm(tmp_path):
    """A real Keras training step: Conv2D (with its bias) -> BatchNormalization cancels the bias, so its BiasAddGrad
    is 0 in exact arithmetic; both dumps hold float32 rounding of it, and the bias updated by it."""
    import keras

    import ascend_emu as ae

    keras.utils.set_random_seed(0)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3), L.BatchNormalization(), L.ReLU(), L.Flatten(),
                          L.Dense(5)])
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(32, 8, 8, 3)).astype(np.float32), "y": rng.integers(0, 5, 32)}
    ae.Device("must_keep_origin_dtype", soc="Ascend910B").train(
        m, data, batch_size=32, steps=1, reference=True, dump_dir=str(tmp_path), dump_steps=[0], progress=False)
    c = compare(tmp_path / "step-0", tmp_path / "reference" / "step-0")
    [noise] = c.noise_ops()
    assert noise.endswith("BiasAddGrad") and c.rows_of(noise)[0]["Result"] == "error"
    assert c.first_divergent() is None and c.counts()["error"] > 1        # the bias updated by it reads it


def test_the_report_says_why_no_op_is_named(tmp_path):
    from ascend_emu.analysis.report import write_report

    dy = centred()
    seq, pair = sums(dy)
    html = open(write_report(*dumps(tmp_path, dy, seq, pair), tmp_path / "r.html")).read()
    assert "Every op passes" not in html and "No divergent op: the failing tensors are rounding noise" in html
    assert "passed over as rounding noise" in html and "db" in html
