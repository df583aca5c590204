"""The interception of ``ae.torch.emulate``: a ``TorchDispatchMode`` below autograd, so that every aten op the
script runs - its forward, autograd's backward and the optimizer's updates - reaches the runner the npu layer
gives it, with the phase it belongs to.

The phase: an aten call made while autograd runs a backward node (``torch._C._current_autograd_node()``) is
``backward``; one made inside ``Optimizer.step`` (torch.optim wraps every step in a ``record_function`` named
``Optimizer.step#<class>.step``, which reaches the dispatcher as ``profiler._record_function_enter_new``) is
``update``; the rest is ``forward``.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ENTER = torch.ops.profiler._record_function_enter_new
_EXIT = torch.ops.profiler._record_function_exit
_OPT_PREFIX = "Optimizer.step#"


class DispatchMode(TorchDispatchMode):
    """Hands every aten call to ``runner(func, args, kwargs, phase)``; ``on_step_end()`` is called when an
    optimizer step's region closes."""

    def __init__(self, runner, on_step_end=None):
        super().__init__()
        self.runner = runner
        self.on_step_end = on_step_end
        self._regions: list = []     # the open record_function regions, innermost last: is it an optimizer step
        self.updating = 0

    def phase(self) -> str:
        if torch._C._current_autograd_node() is not None:
            return "backward"
        return "update" if self.updating else "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is _ENTER:
            handle = func(*args, **kwargs)
            opt = isinstance(args[0], str) and args[0].startswith(_OPT_PREFIX)
            self._regions.append(opt)
            self.updating += opt
            return handle
        if packet is _EXIT:
            out = func(*args, **kwargs)
            # the handle reaches the exit as another wrapper of the same object: regions nest, so the
            # innermost open one closes
            opt = self._regions.pop() if self._regions else False
            if opt:
                self.updating -= 1
                if not self.updating and self.on_step_end is not None:
                    self.on_step_end("optimizer")
            return out
        return self.runner(func, args, kwargs, self.phase())
