"""Numba kernels of the emulated Ascend units (installed as ``ascend_emu.kernels``).

Pure ``@njit`` functions over arrays: no I/O, no graph, no policy objects. 16-bit
floats travel as ``uint16`` bit patterns because Numba on CPU has no float16.
Wrappers in ``ascend_emu`` validate arguments and pick the kernel.
"""
