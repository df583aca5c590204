"""The HTML report: well-formed, self-contained, every section and plot present."""
import base64
import os
import re
from html.parser import HTMLParser

import numpy as np

from ascend_emu.analysis.compare import compare
from ascend_emu.analysis.dump import DumpWriter
from ascend_emu.analysis.report import SECTIONS, write_report

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Checker(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.ids, self.imgs, self.urls = [], [], set(), [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for k in ("src", "href"):
            if k in a:
                self.urls.append(a[k])
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def check_html(path):
    c = Checker()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    c.feed(text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert c.stack == [], c.stack
    assert text.startswith("<!DOCTYPE html>")
    return c, text


def valid_png(src):
    assert src.startswith("data:image/png;base64,")
    data = base64.b64decode(src.split(",", 1)[1], validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[-8:-4] == b"IEND" and len(data) > 1000
    return data


def dumps(tmp_path, overflow=True):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    o1 = x @ w
    o2 = np.tanh(o1) * 3
    o3 = o2 * 2 + 1
    o4 = o3.sum(axis=1)
    bench = [("x", "Placeholder", [], [x]), ("fc/MatMul", "MatMul", ["x", "w"], [o1]),
             ("act", "Tanh", ["fc/MatMul"], [o2]), ("scale", "Mul", ["act"], [o3]), ("sum", "Sum", ["scale"], [o4])]
    npu = []
    for name, t, ins, (v,) in bench:
        v = v.astype(np.float16)
        status, extra = 0, {}
        if name == "act":
            v = (v.astype(np.float32) + rng.standard_normal(v.shape).astype(np.float32)).astype(np.float16)
        if name == "scale" and overflow:
            v = v.copy()
            v[0, 0] = 65504.0
            status, extra = 0x20, {"fp32_check": {"overflow": False, "max_abs": 9e4}}
        npu.append((name, t, ins, [v], status, extra))
    with DumpWriter(tmp_path / "b", kind="bench", config={"precision_mode": "fp32 reference"},
                    model={"name": "toy", "fingerprint": "f"}, inputs_sha256="s") as wr:
        for name, t, ins, outs in bench:
            wr.add_op(name, t, t, "CPU", "float32", ins, outs)
    with DumpWriter(tmp_path / "n", kind="npu", config={"precision_mode": "allow_mix_precision",
                                                       "overflow_mode": "saturation"},
                    model={"name": "toy", "fingerprint": "f"}, inputs_sha256="s") as wr:
        for name, t, ins, outs, status, extra in npu:
            wr.add_op(name, t, t, "AICORE", "float16", ins, outs, status, **extra)
    return tmp_path / "n", tmp_path / "b"


def test_report_sections_and_plots(tmp_path):
    n, b = dumps(tmp_path)
    out = tmp_path / "r.html"
    assert write_report(n, b, out) == str(out)
    c, text = check_html(out)
    assert set(SECTIONS) <= c.ids
    assert len(c.imgs) == 2  # per-op plot + the culprit's histogram
    for src in c.imgs:
        valid_png(src)
    # self-contained: every src/href is inline data
    assert all(u.startswith("data:") for u in c.urls), c.urls
    assert not re.search(r"https?://", text)
    assert "allow_mix_precision" in text and "fp32 reference" in text  # both configurations
    assert "[Tanh][2] act" in text  # first divergent op
    assert "[Mul][3] scale" in text and "abnormal" in text  # overflow panel and verdict
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def test_report_reuses_comparison_and_handles_clean_run(tmp_path):
    n, b = dumps(tmp_path, overflow=False)
    cmp = compare(b, b)  # a dump against itself: nothing fails, nothing overflows
    out = tmp_path / "clean.html"
    write_report(b, b, out, comparison=cmp, title="self <check>")
    c, text = check_html(out)
    assert set(SECTIONS) <= c.ids
    assert len(c.imgs) == 1  # no culprit, no histogram
    valid_png(c.imgs[0])
    assert "self &lt;check&gt;" in text and "No failing op" in text
