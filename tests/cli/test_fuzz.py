"""Fuzz every file and command line ascend-emu reads: each case ends in success or the one-line error.

A seeded generator (``random.Random``) mutates valid manifests, mixlists, fusion switch files,
Device configurations, ``.npy`` files and command lines. Every case must either succeed or raise
:class:`AscendEmuError` with a one-line message (the CLI: exit status 2, one ``ascend-emu: error:``
line, no traceback), and nothing may be written outside the case's own directory.

The default suite runs a few thousand cases (``FUZZ_CASES`` per family, seconds); ``-m fuzz`` runs the
long version (``FUZZ_LONG`` per family; skipped otherwise). A failure prints the family and the case itself.
"""
from __future__ import annotations

import copy
import json
import os
import random
import warnings

import numpy as np
import pytest

from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.dump import DumpWriter, load_dump
from ascend_emu.analysis.overflow import overflow_report
from ascend_emu.errors import AscendEmuError

FUZZ_CASES = 400
FUZZ_LONG = 20000


@pytest.fixture(params=["default", pytest.param("long", marks=pytest.mark.fuzz)])
def cases(request):
    """How many cases per family: FUZZ_CASES, or FUZZ_LONG under ``-m fuzz``."""
    if request.param == "long":
        if "fuzz" not in (request.config.getoption("-m") or ""):
            pytest.skip("the long fuzz run: select it with -m fuzz")
        return FUZZ_LONG
    return FUZZ_CASES

# values a hostile or careless file might hold where another type is expected
NASTY = [None, True, False, 0, -1, 1, 2, 1.5, -0.0, 1e308, 10 ** 30, -(10 ** 30), "", "x", "nan", "inf", "-inf",
         "../../etc/passwd", "/etc/passwd", "a/b.npy", ".", "..", "manifest.json", "\x00", "\n", "é" * 3,
         [], {}, [1, 2], {"a": 1}, [[[[[]]]]], ["x"], {"name": 1}, "float16", "string", "bfloat16", "V2"]


def _nested(depth):
    v = 0
    for _ in range(depth):
        v = [v]
    return v


def _random_value(rng):
    r = rng.random()
    if r < 0.75:
        return copy.deepcopy(rng.choice(NASTY))   # a fresh object: later edits must not change NASTY
    if r < 0.85:
        return _nested(rng.choice([33, 40, 200]))
    if r < 0.95:
        return rng.randint(-2 ** 70, 2 ** 70)
    return "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(0, 30)))


def _paths(value, prefix=()):
    """Every (path, container) position inside a JSON value."""
    out = [prefix]
    if len(prefix) > 12:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _get(value, path):
    for p in path:
        value = value[p]
    return value


def mutate_json(value, rng, n=None):
    """``value`` (a parsed JSON document) with 1-3 random edits: replace, delete, duplicate or add."""
    value = json.loads(json.dumps(value))
    for _ in range(n or rng.randint(1, 3)):
        paths = _paths(value)
        path = rng.choice(paths)
        if not path:
            if rng.random() < 0.1:
                value = _random_value(rng)
            continue
        parent = _get(value, path[:-1])
        key = path[-1]
        op = rng.random()
        if op < 0.55:
            parent[key] = _random_value(rng)
        elif op < 0.75:
            del parent[key]
        elif op < 0.85 and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(parent[key])))
        elif isinstance(parent, dict):
            parent[rng.choice(["extra", "name", "file", "index", "ops", "outputs"])] = _random_value(rng)
        else:
            parent.append(_random_value(rng))
    return value


def mutate_text(text, rng):
    """Byte-level damage: truncation, a flipped character, or garbage spliced in."""
    r = rng.random()
    if r < 0.4:
        return text[:rng.randint(0, len(text))]
    i = rng.randint(0, max(0, len(text) - 1))
    if r < 0.7:
        return text[:i] + rng.choice("{}[]\",:0-e\x00\\") + text[i + 1:]
    return text[:i] + "[" * rng.randint(1, 3000) + text[i:]


def expect_clean(fn, what):
    """Run ``fn``; success or a one-line AscendEmuError pass, anything else fails naming ``what``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except AscendEmuError as e:
        assert "\n" not in str(e), f"{what}: multi-line error {e!r}"
    except Exception as e:   # noqa: BLE001 - this is what the fuzz test looks for
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e


def _snapshot(root):
    out = set()
    for d, dirs, files in os.walk(root):
        for f in dirs + files:
            out.add(os.path.relpath(os.path.join(d, f), root))
    return out


# --------------------------------------------------------------------------- manifests


def _base_dumps(root):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    for kind in ("npu", "bench"):
        with DumpWriter(root / kind, kind=kind, config={"precision_mode": "force_fp16", "overflow_mode": "saturation"},
                        model={"name": "m", "fingerprint": "f"}, inputs_sha256="s",
                        select=lambda name, t: name != "relu") as wr:
            wr.add_op("x", "Placeholder", "Data", "AICORE", "float32", [], [x])
            y = (x @ w).astype(np.float16 if kind == "npu" else np.float32)
            wr.add_op("mm", "MatMul", "MatMulV2", "AICORE", y.dtype, ["x:0", "w:0"], [y], status=0x20 if kind == "npu" else 0,
                      precision={"list": "white", "dtype": "float16", "cube_out": "float16", "reason": "r"},
                      fusion={"rule": "R", "replaces": ["b"]} if kind == "npu" else None,
                      fp32_check={"overflow": False, "max_abs": 3.0} if kind == "npu" else None)
            wr.add_op("relu", "Relu", "Relu", "AICORE", y.dtype, ["mm:0"], [np.maximum(y, 0)])
            wr.add_op("inf", "Exp", "Exp", "AICORE", "float32", ["relu:0"], [np.full(3, np.inf, np.float32)])
            if kind == "npu":
                wr.add_fused("b", "BiasAdd", "R", "mm")
            wr.finish({"outputs": ["inf:0"]})
    return root / "npu", root / "bench"


def _run_readers(npu, bench, out):
    d = load_dump(npu)
    for op in d.ops:
        for o in op["outputs"]:
            if o["file"] is not None:
                d.tensor(op["name"], o["index"])
                list(d.chunks(op["name"], o["index"], chunk=2))
    c = compare(npu, bench)
    c.summary_text()
    fd = c.first_divergent()
    if fd is not None:
        fd.format_text()
        fd.to_dict()
    c.format_table(c.worst(limit=5))
    c.to_csv(out / "c.csv")
    rep = overflow_report(npu)
    rep.format_text()
    json.dumps(rep.to_json(), allow_nan=False)


@pytest.mark.parametrize("side", ["npu", "bench"])
def test_fuzz_manifests(tmp_path, side, cases):
    n = cases
    npu, bench = _base_dumps(tmp_path / "base")
    target = npu if side == "npu" else bench
    good = json.loads((target / "manifest.json").read_text())
    text = (target / "manifest.json").read_text()
    before = _snapshot(tmp_path)
    rng = random.Random(f"manifest-{side}")
    for case in range(n):
        if rng.random() < 0.8:
            m = mutate_json(good, rng)
            body = json.dumps(m)
        else:
            m = None
            body = mutate_text(text, rng)
        (target / "manifest.json").write_text(body)
        expect_clean(lambda: _run_readers(npu, bench, tmp_path), f"manifest case {case}: {body[:300]!r}")
    (target / "manifest.json").write_text(text)
    _run_readers(npu, bench, tmp_path)
    assert _snapshot(tmp_path) == before | {"c.csv"}


def test_fuzz_tensor_files(tmp_path, cases):
    """Truncated or corrupted .npy files inside a dump: DumpError, never a traceback."""
    npu, bench = _base_dumps(tmp_path / "base")
    d = load_dump(npu)
    f = npu / d.op("mm")["outputs"][0]["file"]
    data = f.read_bytes()
    rng = random.Random("npy")
    for case in range(cases):
        r = rng.random()
        if r < 0.4:
            bad = data[:rng.randint(0, len(data) - 1)]
        elif r < 0.8:
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            bad = bytes(b)
        else:
            i = rng.randint(0, 128)
            bad = data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[i:]
        f.write_bytes(bad)
        expect_clean(lambda: _run_readers(npu, bench, tmp_path), f"npy case {case}: {bad[:80]!r}")


# --------------------------------------------------------------------------- mixlists, fusion switches, configs

MIX_KEYS = ["black-list", "white-list", "gray-list", "to-add", "to-remove", "MatMulV2", "Conv2D", "x"]


def _random_mixlist(rng):
    spec = {}
    for _ in range(rng.randint(0, 3)):
        spec[rng.choice(MIX_KEYS)] = {rng.choice(MIX_KEYS): [rng.choice(MIX_KEYS + ["Relu", "Add"])
                                                              for _ in range(rng.randint(0, 3))]}
    return mutate_json(spec, rng, rng.randint(0, 2))


def test_fuzz_mixlists(tmp_path, cases):
    from ascend_emu.npu.precision import MixLists

    rng = random.Random("mixlist")
    p = tmp_path / "mix.json"
    for case in range(cases):
        spec = _random_mixlist(rng)
        body = json.dumps(spec) if rng.random() < 0.8 else mutate_text(json.dumps(spec), rng)
        p.write_text(body)
        expect_clean(lambda: MixLists.default().modify(str(p)), f"mixlist case {case}: {body[:300]!r}")
        expect_clean(lambda: MixLists.default().modify(spec), f"mixlist dict case {case}: {spec!r:.300}")


SWITCH_WORDS = ["Switch", "GraphFusion", "UBFusion", "ALL", "on", "off", "ConvBatchnormFusionPass",
                "MatMulBiasAddFusionPass", "TbeEltwiseFusionPass", "Nope"]


def test_fuzz_fusion_switch(tmp_path, cases):
    from ascend_emu.npu.fusion import FusionConfig

    rng = random.Random("switch")
    p = tmp_path / "fusion_switch.cfg"
    for case in range(cases):
        if rng.random() < 0.5:
            sw = {"Switch": {rng.choice(SWITCH_WORDS): {rng.choice(SWITCH_WORDS): rng.choice(SWITCH_WORDS)
                                                         for _ in range(rng.randint(0, 3))}}}
            sw = mutate_json(sw, rng, rng.randint(0, 2))
            body = json.dumps(sw)
        else:
            sw = None
            body = "\n".join(f"{rng.choice(SWITCH_WORDS)}{rng.choice([':', ' : ', '=', ''])}{rng.choice(SWITCH_WORDS)}"
                             for _ in range(rng.randint(0, 4)))
        if rng.random() < 0.3:
            body = mutate_text(body, rng)
        p.write_text(body)
        expect_clean(lambda: FusionConfig.load(str(p)), f"switch case {case}: {body[:300]!r}")
        if sw is not None:
            expect_clean(lambda: FusionConfig.load(sw), f"switch dict case {case}: {sw!r:.300}")


def test_fuzz_device_configs(cases):
    from ascend_emu import CubeModel, Device

    rng = random.Random("config")
    keys = {"overflow_mode": ["saturation", "inf_nan", "x", None, 1], "soc": ["Ascend910", "Ascend910B", "x", 3],
            "subnormals": ["keep", "flush", "x", None], "impl_mode": ["high_precision", "high_performance", "x"],
            "reduce_accumulate": ["float32", "float16", "x"], "fusion_switch": [None, "off", "on", {}, {"Switch": 1}, 5],
            "modify_mixlist": [None, {}, {"x": 1}, [], 3], "aicpu_fallback": [True, False, 0],
            "cube_model": [None, 1, "x"]}
    modes = ["force_fp16", "allow_mix_precision", "must_keep_origin_dtype", "force_fp32", "allow_fp32_to_fp16",
             "x", None, 3]
    for case in range(cases):
        kw = {k: rng.choice(v) for k, v in keys.items() if rng.random() < 0.4}
        mode = rng.choice(modes)
        expect_clean(lambda: Device(mode, **kw), f"config case {case}: {mode!r} {kw!r}")
        cm = {k: rng.choice([0, 1, 16, -3, "x", None, 2.5, 10 ** 9, "tree", "rne", "hwc"])
              for k in ("block_size", "block_sum", "extra_bits", "normalize", "conv_k_order") if rng.random() < 0.3}
        expect_clean(lambda: CubeModel(**cm), f"cube model case {case}: {cm!r}")


def test_fuzz_onnx_models(tmp_path, cases):
    """Truncations and byte flips of a small valid ONNX model: loaded and replayed, or the one-line error."""
    import sys

    from ascend_emu import Device
    from ascend_emu.frontend.onnx.loader import load_onnx

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
    import onnx_models

    data = onnx_models.resize_einsum().SerializeToString()
    rng = random.Random(31)
    p = tmp_path / "f.onnx"
    for case in range(cases // 8):
        b = bytearray(data)
        if case % 2:
            b = b[:rng.randint(0, len(b) - 1)]
        else:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        p.write_bytes(bytes(b))

        def run():
            Device(soc="Ascend910B", precision_mode="must_keep_origin_dtype").replay(load_onnx(p), progress=False)

        expect_clean(run, f"onnx case {case}")
