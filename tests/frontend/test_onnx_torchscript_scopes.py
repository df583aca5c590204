"""Issue 45 item 7 for TorchScript exports: over 300 ops, the report's graph folds by the module path TorchScript
writes in node names (``/enc_blocks.0/in_proj/Gemm``: scope ``enc_blocks.0/in_proj``), split at "/" only, not by
op-type prefixes (``Mul_``) or at an underscore of a module's name (``in_``). A real torch.onnx.export(dynamo=False).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from ascend_emu import Device
from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.graph_view import graph_section
from ascend_emu.frontend.tf.reference import reference

torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = torch.nn.Linear(8, 8)
        self.out_proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.in_proj(x)
        for _ in range(12):
            y = torch.tanh(y * 0.5 + x)
        return self.out_proj(y)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc_blocks = torch.nn.ModuleList([_Block() for _ in range(10)])

    def forward(self, x):
        for b in self.enc_blocks:
            x = b(x)
        return x


def test_report_folds_torchscript_exports_by_module_path(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "ts.onnx"
    torch.onnx.export(_Net().eval(), (torch.randn(2, 8),), str(path), dynamo=False, opset_version=17)
    ref = reference(path, None, tmp_path / "bench", progress=False)
    # (fusion off: the UB fusion would chain the elementwise ops into a few)
    Device(fusion_switch="off").replay(path, ref.inputs, tmp_path / "npu", progress=False)
    html = graph_section(compare(tmp_path / "npu", tmp_path / "bench"))
    scopes = set(re.findall(r'class="group-node" data-scope="([^"]*)"', html))
    blocks = {f"enc_blocks.{k}/" for k in range(10)}
    assert blocks <= scopes, sorted(scopes)
    # no group is an op-type prefix or half a module name
    assert not [s for s in scopes if s.endswith("_") and s.startswith("enc_blocks")], sorted(scopes)
    np.testing.assert_equal(len(scopes & blocks), 10)
