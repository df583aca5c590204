"""User-facing errors.

Anything the user can fix (a missing file, a bad option, an unsupported op, a
truncated dump) raises :class:`AscendEmuError` (a ``ValueError``) with a one-line
message that names the thing and what to do. The CLI prints that line and exits
non-zero; it never shows a traceback for these.
"""


def printable(text) -> str:
    """``text`` with every character that is not printable (newline, carriage return, ESC and the terminal
    sequences it starts, BEL, bidi overrides, ...) shown as its Python escape (``\\x1b``, ``\\n``): what
    the command line prints from a dump or a model (op names, file names in it) stays one line each and
    cannot move the cursor, clear the screen or retitle the terminal."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class AscendEmuError(ValueError):
    """A problem with the user's input, configuration or files.

    The message is kept to one line: control characters that reach it from a file name or
    a file's content (a newline in a path, say) are shown escaped.
    """

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and not args[0].isprintable():
            args = (printable(args[0]),)
        super().__init__(*args)


class UnsupportedOpError(AscendEmuError):
    """One or more op types have no emulated kernel (and AI CPU fallback is off)."""

    def __init__(self, op_types, supported=()):
        self.op_types = sorted(set(op_types))
        # an ONNX model's unmapped node has op type Onnx<OpType> and runs through onnxruntime instead
        onnx = [t for t in self.op_types if t.startswith("Onnx")]
        runtime = "TensorFlow" if not onnx else "onnxruntime" if len(onnx) == len(self.op_types) else \
            "TensorFlow / onnxruntime"
        msg = ("unsupported op type(s): " + ", ".join(self.op_types)
               + (" (ONNX " + ", ".join(t[4:] for t in onnx) + ": no mapping onto the AI Core's ops)" if onnx else "")
               + f"; drop --no-aicpu-fallback to run them through {runtime} as the NPU's AI CPU would")
        super().__init__(msg)


class DumpError(AscendEmuError):
    """A dump directory is missing, incomplete or corrupt."""
