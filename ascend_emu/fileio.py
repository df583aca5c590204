"""Writing result files so a reader never sees a half-written one."""
from __future__ import annotations

import os
import tempfile

from .errors import AscendEmuError


def check_writable(path, what: str = "") -> str:
    """Fail early, in one line, if ``path`` cannot be written as a file."""
    path = os.fspath(path)
    label = f"{what} {path}".strip()
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise AscendEmuError(f"cannot write {label}: directory {d} does not exist; create it first")
    if os.path.isdir(path):
        raise AscendEmuError(f"cannot write {label}: it is a directory; give a file name")
    return path


def atomic_write_text(path, text: str) -> str:
    """Write ``text`` to ``path`` via a temporary file in the same directory and one rename.

    A missing parent directory or a target that is a directory is a one-line
    :class:`AscendEmuError`; on any failure the temporary file is removed.
    """
    path = check_writable(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        # mkstemp creates 0600; give the file the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
