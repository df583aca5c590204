"""The done-when case of issue 43's dumps: the emulated torch runs of a small CNN and a LLaMA-style block (RMSNorm,
RoPE, SDPA, SwiGLU), exported in msprobe's PyTorch layout, compared by the real ``msprobe compare`` against their
float32 dumps (``reference=True``), and by ``ascend-emu compare`` naming the first divergent op.

One msprobe process compares both (the CNN as rank 0, the block as rank 1 of one step directory): msprobe's start
is most of the time. Skipped only where msprobe is missing and ASCEND_EMU_REQUIRE_MSPROBE is unset.
"""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402
from ascend_emu.analysis.compare import ERROR  # noqa: E402
from ascend_emu.analysis.msprobe import export_msprobe  # noqa: E402

from torch_models import LlamaBlock, cnn_batch, llama_batch, small_cnn  # noqa: E402
from msprobe_real import msprobe_missing, run_msprobe_compare  # noqa: E402


def _train_step(tmp_path, name):
    """One emulated training step on the 910B, dumped with its float32 reference: the CNN in float32 (torch_npu's
    default HF32 convolutions), the block under torch.autocast("npu") (fp16) with its up projection scaled by 3000 (a
    planted large activation: the fp16 product is where it first fails ascend-emu's rule)."""
    if name == "cnn":
        m, (x, y) = small_cnn(), cnn_batch()
    else:
        m, x = LlamaBlock(), llama_batch()
        with torch.no_grad():
            m.up.weight.mul_(3000.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with ae.torch.emulate(soc="Ascend910B", dump=tmp_path / name, reference=True) as run:
        opt.zero_grad()
        if name == "cnn":
            loss = F.cross_entropy(m(x), y)
        else:
            with run.autocast():
                out = m(x)
            loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
    return run.dumps[0], run.reference_dumps[0]


@pytest.mark.models
@pytest.mark.skipif(msprobe_missing() is not None, reason=msprobe_missing() or "")
def test_cnn_and_llama_block_through_the_real_msprobe(tmp_path):
    runs = {}
    for rank, name in enumerate(("cnn", "llama")):
        npu, bench = _train_step(tmp_path, name)
        export_msprobe(npu, tmp_path / "ms_npu", rank=rank, framework="pytorch")
        export_msprobe(bench, tmp_path / "ms_bench", rank=rank, framework="pytorch")
        runs[rank] = (name, npu, bench)
    results = run_msprobe_compare(tmp_path / "ms_npu" / "step0", tmp_path / "ms_bench" / "step0", tmp_path / "out")
    assert len(results) == 2
    for rank, (name, npu, bench) in runs.items():
        [rows] = [r for f, r in results.items() if f"rank{rank}" in f]
        paired = {t["NPU Name"]: t for t in rows if ".output." in t["NPU Name"] and t["Bench Name"] not in ("", "N/A")}
        assert any(".backward.output." in k for k in paired) and any(".forward.output." in k for k in paired)
        ours = {r["NPU Name"]: r for r in ae.compare(npu, bench, rules="msprobe").rows if r["NPU Name"]}
        checked = 0
        for key, t in paired.items():
            op, idx = key.rsplit(".output.", 1)
            r = ours[f"{op}:{idx}"]                 # a torch run's op names are msprobe's keys, unchanged
            assert r["Result"] == t["Result"], (name, key, t["Err_message"], r["Err_message"])
            try:
                cos = float(t["Cosine"])
            except ValueError:
                continue
            assert abs(r["Cosine"] - cos) <= 1e-6, (name, key, r["Cosine"], cos)
            checked += 1
        assert checked >= 20
        # ascend-emu's own rules name the first divergent op; msprobe sees the same numbers there. The CNN's only
        # failing op is its first convolution's bias gradient, rounding noise of an exact 0 (the batch norm cancels
        # the bias), which they pass over: msprobe sees the same numbers there too
        c = ae.compare(npu, bench)
        first = c.first_divergent()
        if name == "cnn":
            assert first is None and len(c.noise_ops()) == 1, c.summary_text()
            op_name, outs = c.noise_ops()[0], c.rows_of(c.noise_ops()[0])
        else:
            assert first is not None and first.name.startswith("Aten."), name
            op_name, outs = first.name, first.outputs
        row = next(r for r in outs if r["Result"] == ERROR)
        t = paired[f"{op_name}.output.{row['NPU Name'].rsplit(':', 1)[1]}"]
        assert float(t["MaxAbsErr"]) == pytest.approx(row["MaxAbsErr"], rel=1e-6, abs=1e-9)
        if name == "llama":
            assert first.op["tf_type"] in ("MatMul", "MatMulV2", "BatchMatMulV2") and first.op["compute_dtype"] == \
                "float16", first.op
