"""Warnings raised while ae.torch.emulate's modes run a torch function name the user's line (not the mode's line in
ascend-emu, frontend/torch/user_warnings.py): torch's C++ warning of float() on a tensor that requires grad (warned
at stack level 1) and a torch Python function's own warning for its caller (F.softmax's implicit dim)."""
import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import ascend_emu as ae  # noqa: E402


def _line(marker: str) -> int:
    src, first = inspect.getsourcelines(test_warnings_inside_the_modes_name_the_users_line)
    return first + next(i for i, s in enumerate(src) if marker in s)


def test_warnings_inside_the_modes_name_the_users_line():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    always = torch._C._get_warnAlways()
    torch._C._set_warnAlways(True)   # the scalar warning is TORCH_WARN_ONCE: an earlier test of this process may
    try:                             # have shown it already
        with ae.torch.emulate(progress=False) as run:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y = m(x)
                v = float(y.sum())                  # SCALAR
                p = F.softmax(y)                    # SOFTMAX
    finally:
        torch._C._set_warnAlways(always)
    assert run.steps is not None and isinstance(v, float) and p.shape == (2, 3)
    got = {str(w.message).split(" ")[0]: (w.filename, w.lineno) for w in caught}
    assert got["Converting"] == (__file__, _line("# SCALAR")), caught
    assert got["Implicit"] == (__file__, _line("# SOFTMAX")), caught
    assert not any("ascend_emu" in w.filename for w in caught), [(w.filename, w.lineno) for w in caught]


def test_user_filters_apply_at_the_users_line():
    """A filter for the user's module acts at the user's call, as without the modes: "error" raises there, "ignore"
    hides it."""
    m = torch.nn.Linear(4, 3)
    with ae.torch.emulate(progress=False):
        y = m(torch.randn(2, 4))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", module=__name__)
            with pytest.raises(UserWarning, match="Implicit dimension choice for softmax"):
                F.softmax(y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.filterwarnings("ignore", module=__name__)
            F.softmax(y)
        assert caught == []
