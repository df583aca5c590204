"""Stand-ins for the Ascend TF adapter's packages, ``npu_bridge`` (TF1) and ``npu_device`` (TF2).

Its directory ``packages/`` (holding only those two) is put on ``sys.path`` by ``ascend-emu run`` only, so a ported script's
``from npu_bridge.npu_init import *`` or ``import npu_device as npu`` imports the packages here. They are
the adapter's names and defaults (ASCEND-FACTS.md section 14) over what the emulator already has: each
option they are given goes to the run's :class:`~ascend_emu.npu.bridge.ScriptRun` (reached through
:mod:`.runtime`, since this layer does not import the device), the training steps run on the emulated
device through the interceptions of :mod:`ascend_emu.frontend.tf.hooks`. :mod:`.options` holds the
adapter's options as data; :mod:`.adapter` the TensorFlow side the two packages share.
"""
import os

#: the directory ``ascend-emu run`` puts first on sys.path: npu_bridge/ and npu_device/, nothing else
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packages")
