"""Deprecated module names of the flat layout (before 0.2), kept importable; and the package's public
submodule names (``ascend_emu.torch``, ``ascend_emu.tf1``), importable as modules.

``import ascend_emu.device`` (and the other old module names) still works: a meta-path
finder maps it to the module's new home in the layered package, with a
DeprecationWarning that names the new path. New code imports the new paths.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module -> new module
MOVED = {
    "ascend_emu.config": "ascend_emu.numerics.policy",
    "ascend_emu.cube": "ascend_emu.numerics.cube",
    "ascend_emu.status": "ascend_emu.numerics.status",
    "ascend_emu.interpreter": "ascend_emu.graph.interpreter",
    "ascend_emu.loader": "ascend_emu.frontend.tf.loader",
    "ascend_emu.inputs": "ascend_emu.frontend.inputs",
    "ascend_emu.models": "ascend_emu.frontend.tf.models",
    "ascend_emu.tf_reference": "ascend_emu.frontend.tf.reference",
    "ascend_emu.device": "ascend_emu.npu.device",
    "ascend_emu.precision": "ascend_emu.npu.precision",
    "ascend_emu.aicpu": "ascend_emu.npu.aicpu",
    "ascend_emu.loss_scale": "ascend_emu.npu.loss_scale",
    "ascend_emu.fusion": "ascend_emu.npu.fusion",
    "ascend_emu.fusion_rules": "ascend_emu.npu.fusion.rules",
    "ascend_emu.dump": "ascend_emu.analysis.dump",
    "ascend_emu.comparison": "ascend_emu.analysis.compare",
    "ascend_emu.overflow": "ascend_emu.analysis.overflow",
    "ascend_emu.report": "ascend_emu.analysis.report",
    "ascend_emu.bisect": "ascend_emu.tools.bisect",
    "ascend_emu.demo": "ascend_emu.tools.demo",
    # the flat frontend of 0.2, before the front ends became subpackages (frontend/tf, frontend/onnx)
    "ascend_emu.frontend.functionalize": "ascend_emu.frontend.tf.functionalize",
    "ascend_emu.frontend.graph_cache": "ascend_emu.frontend.tf.graph_cache",
    "ascend_emu.frontend.graphdef": "ascend_emu.frontend.tf.graphdef",
    "ascend_emu.frontend.hooks": "ascend_emu.frontend.tf.hooks",
    "ascend_emu.frontend.intercept": "ascend_emu.frontend.tf.intercept",
    "ascend_emu.frontend.keras_hooks": "ascend_emu.frontend.tf.keras_hooks",
    "ascend_emu.frontend.loader": "ascend_emu.frontend.tf.loader",
    "ascend_emu.frontend.loops": "ascend_emu.frontend.tf.loops",
    "ascend_emu.frontend.models": "ascend_emu.frontend.tf.models",
    "ascend_emu.frontend.optimizers": "ascend_emu.frontend.tf.optimizers",
    "ascend_emu.frontend.reference": "ascend_emu.frontend.tf.reference",
    "ascend_emu.frontend.sources": "ascend_emu.frontend.tf.sources",
    "ascend_emu.frontend.stateful": "ascend_emu.frontend.tf.stateful",
    "ascend_emu.frontend.tf1_step": "ascend_emu.frontend.tf.tf1_step",
    "ascend_emu.frontend.tfnode": "ascend_emu.frontend.tf.tfnode",
    "ascend_emu.frontend.training": "ascend_emu.frontend.tf.training",
    "ascend_emu.frontend.write_ops": "ascend_emu.frontend.tf.write_ops",
    "ascend_emu.frontend.onnx_loader": "ascend_emu.frontend.onnx.loader",
    "ascend_emu.frontend.onnx_build": "ascend_emu.frontend.onnx.build",
    "ascend_emu.frontend.onnx_ops": "ascend_emu.frontend.onnx.ops",
    "ascend_emu.frontend.onnx_array": "ascend_emu.frontend.onnx.array",
    "ascend_emu.frontend.onnx_node": "ascend_emu.frontend.onnx.node",
    "ascend_emu.frontend.onnx_reference": "ascend_emu.frontend.onnx.reference",
}
# (ascend_emu.numerics and ascend_emu.graph are packages now; they re-export what the old modules held.)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self):
        self._specs = {}
        #: current public names of a submodule (``ascend_emu.torch``), importable as such without a warning
        self.public: dict[str, str] = {}

    def _public(self, fullname):
        """The real name of a public alias or of a module inside one (``ascend_emu.torch.run`` ->
        ``ascend_emu.npu.torch_run.run``): imported under the alias's path, the file would run a second time as a
        module of its own whose relative imports resolve against the wrong package."""
        if fullname in self.public:
            return self.public[fullname]
        for alias, real in self.public.items():
            if fullname.startswith(alias + "."):
                return real + fullname[len(alias):]
        return None

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED or self._public(fullname) is not None:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = self._public(spec.name)
        if new is None:
            new = MOVED[spec.name]
            warnings.warn(f"{spec.name} is deprecated; import {new}", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamped the alias's spec on the real module: give it its own back
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


_FINDER = _Alias()


def install(public: dict[str, str] | None = None) -> None:
    """Map the old names; ``public`` adds the package's submodule attributes (``ascend_emu.torch`` ->
    ``ascend_emu.npu.torch_run``), so ``import ascend_emu.torch`` works as ``ascend_emu.torch`` does."""
    _FINDER.public.update(public or {})
    if _FINDER not in sys.meta_path:
        # first: a module inside a public alias would otherwise be found by the path finder under the alias's name
        sys.meta_path.insert(0, _FINDER)
