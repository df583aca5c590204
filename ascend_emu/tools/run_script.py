"""``ascend-emu run script.py [args]``: a script ported to Ascend, run unchanged on the emulated NPU.

The stand-in ``npu_bridge`` / ``npu_device`` packages (:mod:`ascend_emu.frontend.tf.shim`) go first on
``sys.path``, the interceptions of :mod:`ascend_emu.frontend.tf.hooks` are installed with a
:class:`~ascend_emu.npu.bridge.ScriptRun` as their runner, and the script runs as ``__main__`` with its own
argv. What the script sets (session configs, ``global_options()``, loss-scale optimizers) configures the
emulated device; :meth:`ScriptRun.to_json` is the run's record. Everything is put back afterwards.
"""
from __future__ import annotations

import os
import runpy
import sys

from ..errors import AscendEmuError
from ..npu.bridge import ScriptRun


class ScriptFailed(Exception):
    """The script itself raised (its error, not ours): ``exc`` is what it raised; ``run`` the record so far."""

    def __init__(self, exc: BaseException, run: ScriptRun):
        super().__init__(str(exc))
        self.exc, self.run = exc, run


class ScriptExit(Exception):
    """The script called ``sys.exit(code)`` with a non-zero code."""

    def __init__(self, code, run: ScriptRun):
        super().__init__(str(code))
        self.code, self.run = code, run


def run_script(script, args=(), *, soc: str = "Ascend910", msprobe: bool = False, ranks: int = 1) -> ScriptRun:
    """Run ``script`` (a path) with ``sys.argv = [script, *args]`` on the emulated NPU; the run's record.
    With ``msprobe``, every dump the script asked for is also written in msprobe's layout (``dump_path/msprobe``);
    with ``ranks`` > 1 each training step runs over that many emulated data-parallel ranks.

    Raises :class:`AscendEmuError` for what the emulator or the adapter refuses (a bad option value: the
    adapter's message), :class:`ScriptFailed` when the script raises anything else and :class:`ScriptExit`
    when it exits non-zero.
    """
    from ..frontend.tf.hooks import Hooks
    from ..frontend.tf.keras_hooks import reset_keras_functions
    from ..frontend.tf.shim import SHIM_DIR, adapter, runtime
    from ..numerics.policy import SOC_ALIASES, SOCS

    script = os.fspath(script)
    if not os.path.isfile(script):
        raise AscendEmuError(f"run: no script {script!r}; give the path of the Python script to run")
    if soc not in SOCS and soc not in SOC_ALIASES:
        raise AscendEmuError(f"run: unknown SoC {soc!r}; `ascend-emu socs` lists them")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 1024:
        raise AscendEmuError(f"run: ranks must be a whole number from 1 to 1024, got {ranks!r}")
    run = ScriptRun(script, args, soc=SOC_ALIASES.get(soc, soc), ranks=ranks)
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_modules = set(sys.modules)
    hooks = Hooks(run)
    hooks.install()         # may refuse (another thread's emulation): then nothing is installed
    runtime.install(run)
    sys.argv = [script, *map(str, args)]
    sys.path[:0] = [SHIM_DIR, os.path.dirname(os.path.abspath(script))]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptExit(e.code, run) from None
    except AscendEmuError:
        raise
    except Exception as e:  # noqa: BLE001  (the script's own error: shown as Python shows it)
        raise ScriptFailed(e, run) from e
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        hooks.uninstall()
        reset_keras_functions(hooks.keras.models)
        adapter.unpatch_sessions()
        runtime.uninstall(run)
        for name in set(sys.modules) - saved_modules:
            if name.split(".")[0] in ("npu_bridge", "npu_device"):
                del sys.modules[name]
    run.end()
    if msprobe:
        run.export_msprobe()
    return run


__all__ = ["run_script", "ScriptFailed", "ScriptExit"]
