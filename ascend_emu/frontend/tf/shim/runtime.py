"""The run the shim packages report to: set by ``ascend-emu run`` (an
:class:`ascend_emu.npu.bridge.ScriptRun`), absent otherwise, when importing ``npu_bridge`` or
``npu_device`` from here fails with one line saying how to run the script."""
from __future__ import annotations

_current = []


def install(run) -> None:
    _current.append(run)


def uninstall(run) -> None:
    _current.remove(run)


def runtime():
    if not _current:
        raise ImportError("this npu_bridge / npu_device is ascend-emu's stand-in for the Ascend TF adapter; "
                          "run the script with `ascend-emu run script.py`")
    return _current[-1]
