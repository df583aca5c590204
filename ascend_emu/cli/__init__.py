"""The command line: a thin shell over the public API (``ascend-emu --help``)."""
from .main import build_parser, main  # noqa: F401
