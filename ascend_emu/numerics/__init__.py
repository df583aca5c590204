"""The numerics layer: float formats and the one numerics policy, casts and the vector unit,
the cube (matrix) unit, the float status register. No TensorFlow, no graphs.

- :mod:`.policy`: formats, rounding/overflow/subnormal codes, status bits, SoC table, ``CubeModel``,
  ``NumericsPolicy`` (everything a kernel's behaviour depends on);
- :mod:`.vector`: ``cast``, ``vector``, ``reduce`` on arrays (the vector unit);
- :mod:`.trig`: ``trig``, Sin and Cos as CANN's kernels compute them;
- :mod:`.cube`: ``matmul``, ``batch_matmul``, ``conv2d``, ``depthwise_conv2d`` (the cube unit);
- :mod:`.status`: ``FloatStatus``, the sticky float status register.
"""
from .policy import CubeModel, NumericsPolicy  # noqa: F401
from .status import FloatStatus, decode_status  # noqa: F401
from .reduction import REDUCE_OPS, reduce  # noqa: F401
from .vector import VECTOR_OPS, cast, flush_f32_subnormals, vector  # noqa: F401
from .trig import trig  # noqa: F401
from .cube import batch_matmul, conv2d, depthwise_conv2d, matmul  # noqa: F401
