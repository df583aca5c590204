"""An Einsum the cube kernel cannot lower takes the unsupported-op path, fusion on or off (issue 12)."""
import numpy as np
import pytest

from ascend_emu.errors import UnsupportedOpError
from ascend_emu.frontend.tf.loader import import_tf, load_graph
from ascend_emu.npu.device import Device


@pytest.mark.parametrize("equation", ["ij,jk->ij", "ij,jk->i"])
def test_unlowerable_einsum_falls_back_to_the_ai_cpu(equation):
    tf = import_tf()
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    b = np.arange(4 if equation.endswith("ij") else 1, dtype=np.float32)[-1:] + 1

    @tf.function(input_signature=[tf.TensorSpec((2, 4), tf.float32)])
    def fn(x):
        return tf.einsum(equation, x, w) + b    # Einsum + a constant Add: MatMulBiasAddFusionPass looks at it

    g = load_graph(fn)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    for fusion in (None, "off"):
        res = Device("force_fp32", fusion_switch=fusion).replay(g, {"x": x}, progress=False)
        rec = next(r for r in res.records if r.tf_type == "Einsum")
        assert rec.engine == "AICPU"
        np.testing.assert_allclose(res.outputs[g.outputs[0]], fn(x).numpy(), rtol=1e-6)
    with pytest.raises(UnsupportedOpError, match="Einsum"):
        Device("force_fp32", aicpu_fallback=False).replay(g, {"x": x}, progress=False)
