"""Progress bars go to a terminal only: `ascend-emu replay ... 2> log` or a CI log held every refresh of the bar
(tqdm's carriage-return frames) until replay, reference, train, fit and the sweeps asked tqdm to draw only when
stderr is a terminal, as torch-run's bar does."""
import io

import numpy as np

from ascend_emu import Device
from ascend_emu.graph import Graph, InputSpec, Node


class _Stderr(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _graph():
    nodes = [Node("x", "Placeholder", [], {"dtype": "float32", "shape": [2, 3]}),
             Node("y", "Relu", ["x"], {"T": "float32"}),
             Node("z", "Square", ["y"], {"T": "float32"})]
    return Graph(nodes, [InputSpec("x", "float32", [2, 3])], ["z:0"])


def test_a_replay_draws_its_bar_on_a_terminal_only(monkeypatch):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    for tty in (True, False):
        err = _Stderr(tty)
        monkeypatch.setattr("sys.stderr", err)
        out = Device("force_fp16").replay(_graph(), {"x": x}, None, progress=True)
        np.testing.assert_array_equal(np.asarray(out.tensor("z"), np.float32), np.maximum(x, 0) ** 2)
        assert ("replay" in err.getvalue()) == tty, err.getvalue()
