"""The report opened in a real browser (issue 33): headless Chromium draws the op graph.

Chromium is Debian's package; when absent the test installs it (``apt-get update && apt-get install -y
chromium``, as root), and skips with the reason where it cannot. One small report (the toy dumps of
test_report.py), one screenshot: the graph area (the SVG's background colour) holds drawn pixels, the
first divergent op its ring and fill colour, and the black outline the page's script draws when it selects
that op on opening.
"""
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from ascend_emu.analysis.graph_view import FIRST_COLOR, STATUS_COLORS
from ascend_emu.analysis.report import write_report
from graph_markup import parse
from test_report import dumps

pytestmark = pytest.mark.browser

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
GRAPH_BACKGROUND = (0xfa, 0xfb, 0xfc)   # svg.gv's background in graph_view.CSS


def _find():
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _install() -> str:
    """Install Debian's chromium; returns why it could not ("" when it did)."""
    if not shutil.which("apt-get"):
        return "no apt-get on this system"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "not root, so apt-get cannot install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{' '.join(cmd)} failed: {e}"
        if p.returncode:
            return f"{' '.join(cmd)} failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
    return ""


@pytest.fixture(scope="module")
def chromium():
    path = _find()
    if path is None:
        why = _install()
        path = _find()
        if path is None:
            why = why or "not found after apt-get install chromium"
            pytest.skip(f"headless Chromium is not installed and could not be installed ({why}); install Debian's "
                        "chromium package to run this test")
    return path


def _rgb(hex_color: str):
    return tuple(int(hex_color[k:k + 2], 16) for k in (1, 3, 5))


def screenshot(browser, page, out, tmp_path, size=(1400, 1400)):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={size[0]},{size[1]}",
           f"--screenshot={out}", page.as_uri()]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    assert p.returncode == 0 and out.exists(), p.stderr[-2000:]
    from PIL import Image

    return np.asarray(Image.open(out).convert("RGB")), took


def test_report_graph_renders_in_chromium(chromium, tmp_path):
    n, b = dumps(tmp_path)
    page = tmp_path / "r.html"
    write_report(n, b, page)
    first = [a for a in parse(page.read_text()).nodes.values() if a.get("data-first") == "true"]
    assert len(first) == 1
    img, took = screenshot(chromium, page, tmp_path / "shot.png", tmp_path)
    print(f"chromium screenshot took {took:.2f} s")
    # the graph area: the box painted in the SVG's background colour
    bg = np.all(img == GRAPH_BACKGROUND, axis=2)
    ys, xs = np.nonzero(bg)
    assert ys.size > 100_000, "no graph area in the screenshot"
    area = img[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    drawn = ~np.all(area == GRAPH_BACKGROUND, axis=2)
    assert drawn.mean() > 0.03, f"the graph area is almost blank ({drawn.mean():.3%} drawn)"
    # the first divergent op: its magenta ring, and inside it the fill of its status
    ring = np.all(area == _rgb(FIRST_COLOR), axis=2)
    assert ring.sum() > 200, "the first divergent op's ring is not drawn"
    ry, rx = np.nonzero(ring)
    inside = area[ry.min():ry.max() + 1, rx.min():rx.max() + 1]
    fill = _rgb(STATUS_COLORS[first[0]["data-status"]])
    share = np.all(inside == fill, axis=2).mean()
    assert share > 0.3, f"the first divergent op is not filled with its status colour {fill} ({share:.1%})"
    # the page's script ran: it selected the first divergent op (a black outline, drawn by nothing else)
    assert np.all(inside == (0, 0, 0), axis=2).sum() > 400, "the view's script did not select the first divergent op"
