"""reference --stats-only streams (issue 12, Memory): the same statistics as the one-run reference, any segment size."""
import json

import numpy as np
import pytest

from ascend_emu.frontend.tf import reference as ref_mod
from ascend_emu.frontend.tf.models import demo_model
from ascend_emu.frontend.tf.reference import reference


def _ops(path):
    m = json.loads((path / "manifest.json").read_text())
    return m, [{k: v for k, v in op.items()} for op in m["ops"]]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    d = tmp_path_factory.mktemp("full") / "bench"
    res = reference(demo_model(), None, d, progress=False)
    return d, res


@pytest.mark.parametrize("segment", [1, 7, 16])
def test_streamed_stats_equal_the_full_run(full, tmp_path, monkeypatch, segment):
    d_full, res_full = full
    monkeypatch.setattr(ref_mod, "SEGMENT_OPS", segment)
    res = reference(demo_model(), None, tmp_path / "s", stats_only=True, progress=False)
    m_full, ops_full = _ops(d_full)
    m, ops = _ops(tmp_path / "s")
    assert [o["name"] for o in ops] == [o["name"] for o in ops_full]
    for a, b in zip(ops, ops_full):
        for oa, ob in zip(a["outputs"], b["outputs"]):
            assert oa["file"] is None
            assert {k: oa[k] for k in ("dtype", "shape", "max", "min", "mean", "l2norm", "nan", "inf")} == \
                   {k: ob[k] for k in ("dtype", "shape", "max", "min", "mean", "l2norm", "nan", "inf")}, a["name"]
    assert m["summary"] == m_full["summary"] and m["config"] == m_full["config"] and m["model"] == m_full["model"]
    assert m["inputs_sha256"] == m_full["inputs_sha256"]
    for t, v in res_full.outputs.items():
        np.testing.assert_array_equal(res.outputs[t], v)
    assert set(res.tensors) == set(res.outputs)   # nothing else kept
