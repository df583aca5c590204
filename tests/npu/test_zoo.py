"""Every keras.applications constructor, seeded random weights (never downloaded), at its smallest
input, replayed on the emulated NPU in must_keep_origin_dtype (matching TensorFlow's float32 run)
and in allow_mix_precision.

A fast subset runs in ``make test`` (marker ``models``); the whole list is marked ``zoo`` as well
(``make test-zoo``). A model that cannot be replayed must fail with an AscendEmuError naming the op
and why, and be listed in KNOWN_FAILURES here and in the README.

The keras_hub backbones (BERT, GPT-2, tiny configs, built from their config) need keras-hub, which
``make test`` does not install (it brings tensorflow-text, ~200 MB): they are marked ``zoo`` and skipped
without it (``pip install -e '.[hub]'``).
"""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import Device, reference
from ascend_emu.errors import AscendEmuError
from ascend_emu.frontend.tf import models
from ascend_emu.frontend.tf.loader import load_graph
from ascend_emu.ops import CUBE, OPS
from fp32mode import FP32, fp32  # noqa: F401  (the tests' fp32 mode)

#: the constructors of the installed Keras (so a new Keras adds its models to the zoo)
APPLICATIONS = models.applications()
#: replayed in the default suite: one model per fixed bug, all small
FAST = {"MobileNetV3Small", "EfficientNetB0"}
#: model -> the op and reason its replay fails with (none today)
KNOWN_FAILURES: dict[str, str] = {}
#: model -> why its float32 replay does not match TensorFlow although no op is wrong (expected to fail)
#: (checked on the logits too: its 10-class softmax saturates to the same one-hot on both sides, which hid the
#: divergence from an output-only check)
DIVERGES = {"EfficientNetV2L": "random weights grow activations to ~1e5 over 80 residual blocks; float32 rounding "
                               "differences (our cube's accumulation order against oneDNN's) grow smoothly from "
                               "1 - cosine 1e-6 at block5c to 0.35 at the logits, with no op jumping"}
#: must_keep_origin_dtype against TensorFlow: cosine of the outputs and max |diff| relative to max |ref|
COSINE, REL_MAX_ABS = 0.99999, 1e-4


def marks(name):
    m = [pytest.mark.models] + ([] if name in FAST else [pytest.mark.zoo])
    if name in DIVERGES:
        m.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=DIVERGES[name]))
    return m


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def build(name):
    return with_logits(load_graph(models.application(name, fresh=True)))


def with_logits(g):
    """``g`` with the logits in front of a final Softmax as extra outputs: with random weights a classifier's
    softmax often saturates to one-hot, and equal one-hots say nothing about the logits."""
    extra = []
    for out in g.outputs:
        node = g.node(out.split(":")[0])
        while node.op in ("Identity", "IdentityN") and node.inputs:
            node = g.node(node.inputs[0].split(":")[0].lstrip("^"))
        if node.op == "Softmax":
            extra.append(node.inputs[0] if ":" in node.inputs[0] else node.inputs[0] + ":0")
    g.outputs = list(g.outputs) + [t for t in extra if t not in g.outputs]
    return g


def check_replays(g):
    """must_keep_origin_dtype matches TensorFlow (every output); allow_mix_precision runs the cube in fp16."""
    ref = reference(g, None, progress=False)
    res = Device(**FP32).replay(g, ref.inputs, progress=False, keep_tensors=False)
    mix = Device("allow_mix_precision").replay(g, ref.inputs, progress=False, keep_tensors=False)
    for out in g.outputs:
        theirs = ref.outputs[out]
        ours = np.asarray(res.outputs[out])
        assert ours.shape == theirs.shape and ours.dtype == np.float32
        assert cosine(ours, theirs) >= COSINE
        assert np.max(np.abs(ours.astype(np.float64) - theirs)) <= REL_MAX_ABS * np.max(np.abs(theirs))
        assert np.asarray(mix.outputs[out]).shape == theirs.shape
    assert not any(r.engine == "AICPU" for r in res.records)
    cube = [r for r in mix.records if r.tf_type in OPS and OPS[r.tf_type].kind == CUBE]
    assert cube and all(r.compute_dtype == "float16" for r in cube)
    check_other_socs(g, ref)


def check_other_socs(g, ref):
    """The inference card with its defaults (force_fp16, saturation) and the A3 in its training default
    (origin: float32 convolutions through HF32) run every op on the AI Core; HF32 stays close to float32."""
    card = Device(soc="Ascend310P3").replay(g, ref.inputs, progress=False, keep_tensors=False)
    a3 = Device(soc="Ascend910_93", precision_mode_v2="origin").replay(g, ref.inputs, progress=False,
                                                                       keep_tensors=False)
    assert card.summary["per_engine_dtype"].keys() <= {"AICORE", "HOST"}
    assert a3.summary["per_engine_dtype"].keys() <= {"AICORE", "HOST"}
    assert any(r.name.endswith("_to_hf32") for r in a3.records)
    for out in g.outputs:
        assert np.asarray(card.outputs[out]).shape == ref.outputs[out].shape
        assert cosine(a3.outputs[out], ref.outputs[out]) >= 0.99


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in APPLICATIONS])
def test_application_replays(name):
    if name in KNOWN_FAILURES:
        with pytest.raises(AscendEmuError, match=KNOWN_FAILURES[name]):
            check_replays(build(name))
        return
    check_replays(build(name))


def _hub_marks():
    try:
        import keras_hub  # noqa: F401
        return [pytest.mark.models, pytest.mark.zoo]
    except ImportError:
        return [pytest.mark.models, pytest.mark.zoo,
                pytest.mark.skip(reason="keras-hub is not installed (pip install -e '.[hub]')")]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_hub_marks()) for n in models.HUB_BACKBONES])
def test_keras_hub_backbone_replays(name):
    g = load_graph(models.hub_backbone(name, fresh=True))
    assert {"GatherV2", "Softmax"} <= {n.op for n in g.nodes}          # embeddings and attention
    check_replays(g)
