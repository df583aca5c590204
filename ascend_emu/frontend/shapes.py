"""Input shapes given by the user (``--shape NAME=1,224,224,3`` or a dict), parsed and checked.

No TensorFlow here; the loader and the input builder both use it.
"""
from __future__ import annotations

from ..errors import AscendEmuError

#: largest dimension and rank a --shape may give (TensorFlow's int32 index range; its rank limit)
MAX_DIM = (1 << 31) - 1
MAX_RANK = 254


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """``"1,224,224,3"`` -> ``(1, 224, 224, 3)``; ``""`` is a scalar."""
    text = text.strip().strip("()[]")
    if not text:
        return ()
    try:
        pieces = text.replace("x", ",").split(",")
        if any(not d.strip() for d in pieces):
            raise ValueError(text)
        dims = tuple(int(d) for d in pieces)
    except ValueError:
        raise AscendEmuError(f"{what} {text!r} is not a list of integers; write it like 1,224,224,3") from None
    if any(d < 0 for d in dims):
        raise AscendEmuError(f"{what} {text!r} has a negative dimension; give every dimension")
    if any(d > MAX_DIM for d in dims) or len(dims) > MAX_RANK:
        raise AscendEmuError(f"{what} {text[:60]!r} is too large (at most {MAX_RANK} dimensions of at most "
                             f"{MAX_DIM} each); give the shape the model runs with")
    return dims


def shape_items(shapes) -> list[tuple[str, tuple]]:
    """``--shape`` values (CLI strings ``NAME=1,224,224,3`` or a dict name -> dims) as (name, dims) pairs."""
    if not shapes:
        return []
    if isinstance(shapes, (list, tuple)):
        items = []
        for s in shapes:
            name, eq, dims = str(s).partition("=")
            if not eq or not name:
                raise AscendEmuError(f"--shape {s!r} must look like NAME=1,224,224,3")
            items.append((name.strip(), parse_shape(dims, f"--shape {s!r}")))
        return items
    if isinstance(shapes, dict):
        return [(k, tuple(None if d is None or int(d) < 0 else int(d) for d in v)) for k, v in shapes.items()]
    raise AscendEmuError(f"shapes must be a dict name -> shape or a list of 'NAME=1,2,3' strings, "
                         f"not {type(shapes).__name__}")


def check_shape_fits(spec, dims) -> None:
    """A ``--shape`` must agree with the signature's known dimensions."""
    if spec.shape is not None and (len(dims) != len(spec.shape) or any(
            k is not None and d is not None and k != d for k, d in zip(spec.shape, dims))):
        raise AscendEmuError(f"--shape for input {spec.name!r} is {tuple(dims)}, which does not fit "
                             f"its signature {_fmt(spec.shape)}")


def _fmt(shape) -> str:
    if shape is None:
        return "(unknown rank)"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def is_pt2(model) -> bool:
    """Whether ``model`` is an exported PyTorch program: a ``.pt2`` path or a ``torch.export.ExportedProgram``
    (told apart without importing torch)."""
    import os

    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).lower().endswith(".pt2")
    return type(model).__name__ == "ExportedProgram"
