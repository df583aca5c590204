"""The emulated NPU: ``Device`` (precision modes and lists, fusion, op dispatch on the emulated units,
float status, dumps), the AI CPU fallback, loss scaling, and training on top of replay."""
