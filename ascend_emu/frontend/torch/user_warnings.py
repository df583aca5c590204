"""Warnings raised while our torch modes run a function, shown at the user's line.

A torch function mode calls the function itself (``func(*args, **kwargs)`` in its ``__torch_function__``), so a
warning that the function raises for its caller (torch's C++ ``TORCH_WARN``, as "Converting a tensor with
requires_grad=True to a scalar", is warned at stack level 1; a Python ``warnings.warn(..., stacklevel=2)`` inside
torch, as F.softmax's implicit dim) names the mode's line in ascend-emu instead of the line of the user's script that
made the call. Python 3.11 has no ``skip_file_prefixes`` (3.12), and the C++ warnings take no stack level anyway.

So while a mode is entered (:func:`enter`, :func:`leave`), a warning located in ascend-emu's own files is warned
again, when it is about to be shown (``warnings._showwarnmsg``, which the interpreter calls for every warning it
shows, while the warning's caller is still on the stack), at the innermost frame outside ascend-emu and torch: the
user's filters and once-per-location registry apply there, as without the modes. An ``always`` filter for
ascend-emu's modules (at the front while entered) keeps the first showing of one warning at the mode's line from
hiding the next ones from other user lines. Nothing is paid per call: only a warning shown pays the stack walk.
A filter the user adds while a mode is entered that matches any module (``simplefilter("error")``) comes before that
``always`` filter, so it acts at the mode's line first (an "error" raises from there, through the user's line).
"""
from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.overrides import TorchFunctionMode

_OURS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_SKIP = (_OURS, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
         os.path.dirname(os.path.abspath(warnings.__file__)) + os.sep + "warnings.py")
_MODULE = r"ascend_emu\."
_state = {"depth": 0, "shown": None}


def _user_frame():
    """The innermost frame outside ascend-emu, torch and the warnings module (None: there is none)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    return f


def _show(msg) -> None:
    frame = _user_frame() if msg.filename.startswith(_OURS) else None
    if frame is None:
        _state["shown"](msg)
        return
    g = frame.f_globals
    warnings.warn_explicit(msg.message, msg.category, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}),
                           module_globals=g)


def enter() -> None:
    """A mode is entered: relocate the warnings located in ascend-emu (nested modes install once)."""
    if _state["depth"] == 0:
        _state["shown"] = warnings._showwarnmsg
        warnings._showwarnmsg = _show
        warnings.filterwarnings("always", module=_MODULE)
    _state["depth"] += 1


def leave() -> None:
    """A mode is left: the last one restores what :func:`enter` changed."""
    _state["depth"] -= 1
    if _state["depth"] == 0:
        if warnings._showwarnmsg is _show:
            warnings._showwarnmsg = _state["shown"]
        ours = [f for f in warnings.filters if f[0] == "always" and f[2] is Warning and f[3] is not None
                and f[3].pattern == _MODULE]
        if ours:
            warnings.filters.remove(ours[0])
            warnings._filters_mutated()


class UserLineMode(TorchFunctionMode):
    """A torch function mode whose functions' warnings name the user's line (:func:`enter` while it is entered)."""

    def __enter__(self):
        enter()
        try:
            return super().__enter__()
        except BaseException:
            leave()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            leave()
