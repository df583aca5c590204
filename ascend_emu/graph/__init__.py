"""The graph layer: plain nodes (no TensorFlow) and the small interpreter that walks them."""
from .core import Graph, InputSpec, Node, split_tensor_name, tensor_name  # noqa: F401
from .interpreter import interpret, last_uses  # noqa: F401
