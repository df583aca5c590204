"""The torch eager path's assumed parameters (numerics/assumptions.py, family torch; NUMERICS.md section 16):
each is a Device option the run reads, and changing it changes the result where it must."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.numerics import assumptions as asm  # noqa: E402

from torch_models import cnn_batch, small_cnn  # noqa: E402

TORCH_PARAMS = {"fa_kv_block", "use_fp16_out", "compound_ops", "float_status_clear"}


def test_the_four_are_registered_and_refused_when_unknown():
    assert {a.name for a in asm.ASSUMED if a.family == asm.TORCH} == TORCH_PARAMS
    with pytest.raises(AscendEmuError) as e:
        ae.torch.emulate("Ascend910B", fa_kv_block=100)
    assert "fa_kv_block" in str(e.value) and "\n" not in str(e.value)
    with ae.torch.emulate("Ascend910", compound_ops="float32", fa_kv_block=64) as run:
        pass
    dev = run.config()["device"]
    assert dev["compound_ops"] == "float32" and dev["fa_kv_block"] == 64 and dev["float_status_clear"] == "update"


def _sdpa(block):
    from ascend_emu.ops import OPS, OpContext

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g).half() * 3 for _ in range(3))
    k = torch.randn(1, 2, 320, 16, generator=g).half() * 3
    v = torch.randn(1, 2, 320, 16, generator=g).half()
    with ae.torch.emulate("Ascend910B", fa_kv_block=block) as run:
        o = F.scaled_dot_product_attention(q, k, v)
    assert any(r.op_types == ["_FlashAttentionScore"] for r in run.records)
    ctx = OpContext.from_policy(run.device.numerics, dtype="float16")
    want, _ = OPS["_FlashAttentionScore"](q.numpy(), k.numpy(), v.numpy(), ctx=ctx, scale_value=0.25,
                                         kv_block=block)
    return o, want


def test_fa_kv_block_reaches_flash_attention_and_moves_its_bits():
    o64, want64 = _sdpa(64)
    o128, want128 = _sdpa(128)
    assert np.array_equal(o64.numpy(), want64) and np.array_equal(o128.numpy(), want128)
    assert not torch.equal(o64, o128)      # the online rescale per block rounds P at other maxima


def test_use_fp16_out_on_the_910():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 8, generator=g)
    exact = a.half().double() @ b.half().double()           # fp16 operands, exact products and sums
    with ae.torch.emulate("Ascend910") as run:             # allow_fp32_to_fp16: ALLOW_FP32_DOWN_PRECISION
        y16 = a @ b
    with ae.torch.emulate("Ascend910", use_fp16_out="float32"):
        y32 = a @ b
    assert run.records[0].cube_math_type == "USE_FP16"
    assert y16.dtype == y32.dtype == torch.float32
    assert torch.equal(y16, y16.half().float())             # passed through fp16
    assert not torch.equal(y32, y32.half().float())         # the accumulator's float32
    assert (y32.double() - exact).abs().max() < 1e-4 * exact.abs().max()
    assert torch.equal(y32.half(), y16) or (y32.half().float() - y16).abs().max() <= 2 ** -10 * y16.abs().max()


def _rint16(a):
    return np.asarray(a, np.float32).astype(np.float16)


@pytest.mark.parametrize("mode", ["sequence", "float32"])
def test_compound_ops_round_per_step_or_once(mode):
    g = torch.Generator().manual_seed(11)
    x, t1, t2 = (torch.randn(4096, generator=g).half() for _ in range(3))
    t2 = t2.abs() + 0.5
    with ae.torch.emulate("Ascend910B", compound_ops=mode):
        got = {"addcmul": torch.addcmul(x, t1, t2, value=0.3), "addcdiv": torch.addcdiv(x, t1, t2, value=0.3),
               "lerp": torch.lerp(x, t1, 0.3)}
    X, A, B = (t.numpy() for t in (x, t1, t2))
    f = np.float32
    if mode == "sequence":         # each vector op in fp16: the inputs' products and sums rounded every step
        v = np.float16(0.3)
        want = {"addcmul": _rint16(X.astype(f) + _rint16(_rint16(A.astype(f) * B) * f(v))),
                "addcdiv": _rint16(X.astype(f) + _rint16(_rint16(A.astype(f) / B) * f(v))),
                "lerp": _rint16(X.astype(f) + _rint16(_rint16(A.astype(f) - X) * f(v)))}
    else:                          # widened to float32, every step in float32, one rounding
        v = f(0.3)
        want = {"addcmul": _rint16(X.astype(f) + (A.astype(f) * B.astype(f)) * v),
                "addcdiv": _rint16(X.astype(f) + (A.astype(f) / B.astype(f)) * v),
                "lerp": _rint16(X.astype(f) + (A.astype(f) - X.astype(f)) * v)}
    for name, y in got.items():
        assert y.dtype == torch.float16
        assert np.array_equal(y.numpy().view(np.uint16), want[name].view(np.uint16)), (mode, name)


def test_compound_ops_move_silu_in_fp16_only():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4096, generator=g).half() * 4
    outs = {}
    for mode in ("sequence", "float32"):
        with ae.torch.emulate("Ascend910B", compound_ops=mode):
            outs[mode] = (F.silu(x), F.silu(x.float()))
    assert not torch.equal(outs["sequence"][0], outs["float32"][0])
    assert torch.equal(outs["sequence"][1], outs["float32"][1])          # float32 tensors: the same steps
    exact = (x.double() * torch.sigmoid(x.double())).half()
    near = lambda y: (y.float() - exact.float()).abs() <= exact.float().abs() * 2 ** -10 + 2 ** -24  # noqa: E731
    assert near(outs["float32"][0]).float().mean() > near(outs["sequence"][0]).float().mean()


def _forward_overflow_training(clear, scaler_cls=None):
    """Two scaled steps on the 910; step 1's forward overflows in an fp16 product the loss never reads."""
    x, y = cnn_batch()
    m = small_cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = (scaler_cls or torch.amp.GradScaler)("cpu")
    with ae.torch.emulate("Ascend910", float_status_clear=clear) as run:
        for step in range(2):
            opt.zero_grad()
            with run.autocast():
                out = m(x)
                if step == 1:
                    (out * 1e5).sum()            # saturates: the status register's overflow bit, nothing else
                loss = F.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return run


def test_float_status_clear_decides_whether_a_forward_overflow_skips_the_step():
    upd = _forward_overflow_training("update")
    assert [s["skipped"] for s in upd.steps] == [False, True]
    assert upd.steps[1]["first_overflow"]["phase"] == "forward"
    sc = _forward_overflow_training("scale")
    assert [s["skipped"] for s in sc.steps] == [False, False]     # scale() cleared it after the forward
    assert sc.steps[1]["first_overflow"]["phase"] == "forward"   # the overflow is still recorded


def test_torch_npus_own_scaler_clears_at_scale_whatever_the_parameter():
    """torch_npu.npu.amp.GradScaler clears the register at its first scale() of an iteration (ASCEND-FACTS 13.2): the
    forward's overflow does not skip the step even under float_status_clear="update" (upstream's scaler's default)."""
    from ascend_emu.frontend.torch import npu_shim

    class NpuScaler(npu_shim.GradScaler):
        def __init__(self, device):
            super().__init__()

    with npu_shim.installed():
        run = _forward_overflow_training("update", NpuScaler)
    assert [s["skipped"] for s in run.steps] == [False, False]
    assert run.steps[1]["first_overflow"]["phase"] == "forward"
