"""``ascend-emu torch-run``: a user's PyTorch script written for torch_npu, run unchanged on the emulated NPU.

:func:`torch_run` runs the script as ``python script.py args`` would (``runpy``, its own ``sys.argv``,
``__name__ == "__main__"``, its directory first on ``sys.path``) inside ``ae.torch.emulate`` with the
``torch_npu`` shim installed (:mod:`ascend_emu.frontend.torch.npu_shim`), and returns the run's record: the
torch_npu options and where each came from, what ran where, the steps (skipped ones with their first
overflowing op), the dumps.

A script that fails on its own is the user's: its traceback (from the script's first frame) is printed and
its status returned, as Python would; a ``sys.exit(n)`` returns n. What ascend-emu refuses (a bad option value,
an unsupported device index, bf16 autocast on the 910, a missing script, a missing torch) is an
:class:`~ascend_emu.errors.AscendEmuError`: one line, exit 2.
"""
from __future__ import annotations

import linecache
import os
import runpy
import sys
import traceback
import warnings

from ..errors import AscendEmuError


class _StepsDone(BaseException):
    """Raised at the end of the last step ``steps`` asks for, to stop the script there (not an error)."""


def _check_script(script) -> str:
    path = os.fspath(script)
    if not os.path.exists(path):
        raise AscendEmuError(f"script {path} does not exist; give the path of a Python file")
    if not os.path.isfile(path):
        raise AscendEmuError(f"script {path} is not a file; give the path of a Python file")
    # a file Python cannot even compile is not a script that fails on its own: one line, before anything runs
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise AscendEmuError(f"script {path} is not Python source ({e.msg} at line {e.lineno}); give the path of "
                             "a Python file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise AscendEmuError(f"script {path} is not Python source ({str(e).splitlines()[0][:120]}); give the path "
                             "of a Python file") from None
    except OSError as e:
        raise AscendEmuError(f"cannot read script {path}: {e.strerror or e}") from None
    return path


def _python_formatwarning(message, category, filename, lineno, line=None) -> str:
    """A warning as Python prints it (``file:line: Category: message`` and the source line): the script's own
    warnings are the script's, not ascend-emu's (the command line words its own as ``ascend-emu: warning:``)."""
    text = f"{filename}:{lineno}: {category.__name__}: {message}\n"
    src = (line if line is not None else linecache.getline(filename, lineno)).strip()
    return text + (f"  {src}\n" if src else "")


def _script_traceback(e: BaseException, path: str) -> str:
    """The traceback of ``e`` from the script's first frame on (ascend-emu's and runpy's frames left out)."""
    tb = e.__traceback__
    real = os.path.realpath(path)
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) != real:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb if tb is not None else e.__traceback__))


def torch_run(script, argv=(), *, soc: str = "Ascend910B", dump=None, dump_steps=None, reference: bool = False,
              steps: int | None = None, stats_only: bool = False, overwrite: bool = False,
              aicpu_fallback: bool = True, stderr=None, progress: bool = False, **numerics) -> dict:
    """Run ``script`` with ``argv`` unchanged on the emulated NPU (torch_npu's eager numerics); the run's record.

    Parameters
    ----------
    script : str or os.PathLike
        The Python file (written for torch_npu: ``import torch_npu``, ``.npu()``, ``torch.autocast("npu")``, ...).
    argv : sequence of str
        Its arguments (``sys.argv[1:]`` as the script sees them).
    soc : str
        The emulated SoC; torch_npu's defaults follow it (ASCEND-FACTS.md 13.1).
    dump, dump_steps, stats_only, reference, overwrite
        As :func:`ascend_emu.npu.torch_run.emulate`: ascend-emu dumps of the listed steps (default step 0) in
        ``dump/step-N``, with ``reference`` the same calls in torch float32 in ``dump/reference/step-N``.
    steps : int, optional
        Stop the script at the end of its ``steps``-th training step (an optimizer step or a GradScaler
        iteration); None: run it to its end.
    aicpu_fallback : bool
        False: an aten op without an emulated kernel is refused in one line instead of running on the AI CPU.
    stderr : file, optional
        Where a failing script's traceback is printed (default ``sys.stderr``).
    progress : bool
        A progress bar on standard error (the aten calls run, the steps done) while it is a terminal.
    **numerics
        The torch path's assumed parameters (``fa_kv_block``, ``use_fp16_out``, ``compound_ops``,
        ``float_status_clear``; NUMERICS.md section 16), as :func:`~ascend_emu.npu.torch_run.emulate` takes them.

    Returns
    -------
    dict
        ``script``, ``argv``, ``exit_status`` (the script's: 0, its ``sys.exit`` code, 1 after an uncaught
        exception), ``error`` (that exception's one-line text, or None), ``stopped_after_steps``, ``options`` (the
        torch_npu options with ``sources``: where each came from), ``torch_npu_calls`` (what the script called
        that is not an option: set_device, GradScaler, set_option keys without numerics), ``aten_calls``,
        ``per_engine_dtype`` (what ran where), ``steps``, ``skipped_steps``, ``first_overflow``, ``dumps``,
        ``reference_dumps``, ``assumed_parameters`` (the torch path's, as the run used them).
    """
    path = _check_script(script)
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise AscendEmuError(f"steps must be a positive number of training steps, got {steps!r}")
    argv = [str(a) for a in argv]
    from ..frontend.torch import npu_shim        # AscendEmuError in one line when torch is not installed
    from ..npu.torch_run import emulate
    from ..npu.torch_run.run import TORCH_ASSUMED

    run = emulate(soc=soc, dump=dump, dump_steps=dump_steps, reference=reference, stats_only=stats_only,
                  overwrite=overwrite, aicpu_fallback=aicpu_fallback, progress=progress, **numerics)
    stopped = None
    if steps is not None:
        # stop at the end of the requested step: the run has closed its dump when end_step returns
        end_step = run.end_step

        def end_step_then_stop(why):
            end_step(why)
            if run.step >= steps:
                raise _StepsDone()
        run.end_step = end_step_then_stop
    status, error = 0, None
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path] + argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        with run, npu_shim.installed(), warnings.catch_warnings():
            formatwarning, warnings.formatwarning = warnings.formatwarning, _python_formatwarning
            try:
                runpy.run_path(path, run_name="__main__")
            except _StepsDone:
                stopped = steps
            except SystemExit as e:
                code = e.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
                if code is not None and not isinstance(code, int):
                    print(code, file=stderr or sys.stderr)
            except AscendEmuError:
                raise
            except Exception as e:  # noqa: BLE001  (the script's own failure: its traceback, its status)
                print(_script_traceback(e, path), end="", file=stderr or sys.stderr)
                status, error = 1, f"{type(e).__name__}: {e}".splitlines()[0][:500]
            finally:
                warnings.formatwarning = formatwarning
            calls = npu_shim.calls()
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    s = run.summary()
    return {"script": os.path.abspath(path), "argv": argv, "soc": run.options.soc, "exit_status": status,
            "error": error, "stopped_after_steps": stopped, "options": s["options"], "torch_npu_calls": calls,
            "aten_calls": s["aten_calls"], "per_engine_dtype": s["per_engine_dtype"], "steps": run.steps,
            "skipped_steps": [st["step"] for st in run.steps if st.get("skipped")],
            "first_overflow": s["first_overflow"], "float_status": s["float_status"], "dumps": s["dumps"],
            "reference_dumps": s["reference_dumps"],
            # the torch path's assumed parameters this run used (NUMERICS.md section 16)
            "assumed_parameters": {n: getattr(run.device.numerics, n) for n in TORCH_ASSUMED}}
