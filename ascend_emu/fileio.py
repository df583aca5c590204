"""Reading and writing the files ascend-emu touches, so a fault is one line and a reader never sees half a file.

Writes go through a temporary file and one rename, and refuse a target that is a symbolic link or
read-only; no output directory is written through a symbolic link (:func:`check_output_dir`). Reads of
configuration and manifest files never follow a symbolic link in the last path component, cap the size
and the JSON nesting depth, and turn every ``OSError`` into a one-line :class:`AscendEmuError` naming the
file; every path a dump names is confined to the dump (:func:`open_in_dump`).
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile

from .errors import AscendEmuError

#: deepest nesting of arrays/objects accepted in a JSON file ascend-emu reads (manifests need 6)
MAX_JSON_DEPTH = 32
#: largest JSON file read (the manifest of a very large model is a few MB)
MAX_JSON_BYTES = 256 << 20
#: open flag that refuses a symbolic link as the last path component (0 where the OS has none)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def check_path(path, what: str) -> str:
    """``path`` as a string, refused in one line if the OS cannot take it (a NUL byte)."""
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if "\x00" in path:
        raise AscendEmuError(f"{what} {path!r} contains a NUL byte, which no file name can hold; check the path")
    return path


def os_error_text(e: OSError) -> str:
    """The OS's words for an OSError (``"No space left on device"``), or its text."""
    return e.strerror or str(e)


def json_depth(value) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), without recursion."""
    depth = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return depth


def parse_json(text: str, what: str, *, max_depth: int = MAX_JSON_DEPTH, error=AscendEmuError,
               fix: str = "fix the file"):
    """Parse JSON ``text``, nesting capped at ``max_depth``; failures are one-line ``error`` naming ``what``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what} is nested deeper than {max_depth} levels; {fix}") from None
    except ValueError as e:   # JSONDecodeError
        raise error(f"{what} is corrupt: not valid JSON ({e}); {fix}") from None
    if json_depth(value) > max_depth:
        raise error(f"{what} is nested deeper than {max_depth} levels; {fix}")
    return value


def read_text(path, what: str, *, max_bytes: int = MAX_JSON_BYTES, error=AscendEmuError,
              hint: str = "check the path") -> str:
    """A UTF-8 text file, never read through a symbolic link; every failure (missing, a directory,
    unreadable, too large, not UTF-8) is a one-line ``error`` naming ``what`` and the path."""
    path = check_path(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{what} {path} not found; {hint}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{what} {path} is a symbolic link; give the file itself") from None
        raise error(f"{what} {path} cannot be read ({os_error_text(e)}); {hint}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise error(f"{what} {path} is a directory; give a file")
            if not stat.S_ISREG(st.st_mode):
                raise error(f"{what} {path} is not a regular file; give a file")
            if st.st_size > max_bytes:
                raise error(f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} ascend-emu reads; "
                            f"{hint}")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{what} {path} cannot be read ({os_error_text(e)}); {hint}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text ({e.reason} at byte {e.start}); fix the file") from None


def is_plain_name(name) -> bool:
    """A file name with no directory part: not empty, not ``.`` or ``..``, no separator, no NUL byte."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "\x00" not in name
            and not any(s and s in name for s in ("/", os.sep, os.altsep)))


def open_in_dump(directory, *names: str, what: str, error=AscendEmuError, hint: str = "check the path"):
    """The file ``directory/names[0]/.../names[-1]`` opened for binary reading: the one confinement rule
    for every path a dump names (a tensor file of a manifest, an msprobe ``data_name``).

    Every name must be a plain file name (:func:`is_plain_name`: no directory part, no ``..``, never
    absolute), checked before anything is opened; each is opened relative to the one before it without
    following a symbolic link (the directories with ``O_DIRECTORY``, the last with ``O_NOFOLLOW``), and
    the last must be a regular file. So nothing outside ``directory`` is opened, and a refusal never tells
    whether a path outside it exists. Failures are a one-line ``error``: ``"{what} {name} is missing|a
    symbolic link|not a regular file|...; {hint}"``. Returns an unbuffered binary file object.
    """
    shown = "/".join(str(n)[:80] for n in names)
    bad = [n for n in names if not is_plain_name(n)]
    if bad:
        raise error(f"{what} name {str(bad[0])[:80]!r} is not a plain file name inside the dump (a path or a "
                    f"link in a dump is never followed); {hint}")
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = None
    try:
        try:
            fd = os.open(check_path(directory, what), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nonblock)
        except OSError as e:
            raise error(f"{what} {shown}: the dump directory cannot be read ({os_error_text(e)}); {hint}") from None
        for i, name in enumerate(names):
            last = i == len(names) - 1
            try:
                new = os.open(name, os.O_RDONLY | O_NOFOLLOW | nonblock
                              | (0 if last else getattr(os, "O_DIRECTORY", 0)), dir_fd=fd)
            except FileNotFoundError:
                raise error(f"{what} {shown} is missing; {hint}") from None
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    # a link (O_NOFOLLOW) or a file where a directory belongs; told apart inside the dump only
                    try:
                        link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                    except OSError:
                        link = False
                    kind = "a symbolic link" if link else "not a directory"
                    where = shown if last else f"{shown}: {name[:80]}"
                    raise error(f"{what} {where} is {kind}, which a dump never holds there "
                                f"(a link is never followed); {hint}") from None
                raise error(f"{what} {shown} cannot be read ({os_error_text(e)}); {hint}") from None
            os.close(fd)
            fd = new
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} {shown} is not a regular file; {hint}")
        f = os.fdopen(fd, "rb", buffering=0)
        fd = None
        return f
    finally:
        if fd is not None:
            os.close(fd)


def read_json(path, what: str, *, max_depth: int = MAX_JSON_DEPTH, error=AscendEmuError,
              hint: str = "check the path", max_bytes: int = MAX_JSON_BYTES, fix: str = "fix the file"):
    """:func:`read_text`, then :func:`parse_json`."""
    return parse_json(read_text(path, what, error=error, hint=hint, max_bytes=max_bytes),
                      f"{what} {os.fspath(path)}", max_depth=max_depth, error=error, fix=fix)


def check_output_dir(path, what: str, *, root=None) -> str:
    """Refuse, in one line, an output directory ascend-emu would write through a symbolic link: the one
    check of every directory it writes (dumps, their ``step-N``/``reference`` parts, msprobe exports,
    kept dumps). ``path`` must not be a link nor an existing non-directory; with ``root`` (the directory
    the user named, ``path`` below it: ``DUMP`` of ``DUMP/reference/step-3``) neither may ``root`` nor any
    directory between them. Missing directories are fine (they are created later)."""
    path = check_path(path, what)
    chain = [path]
    if root is not None:
        root = check_path(root, what)
        rel = os.path.relpath(path, root)
        if rel != os.curdir and rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            parts = rel.split(os.sep)
            chain = [os.path.join(root, *parts[:i]) for i in range(len(parts) + 1)]
    for p in chain:
        label = f"{what} {path}" + (f": {p}" if p != path else "")
        if os.path.islink(p):
            raise AscendEmuError(f"{label} is a symbolic link; ascend-emu never writes through a link: give the "
                                 "real directory")
        if os.path.lexists(p) and not os.path.isdir(p):
            raise AscendEmuError(f"{label} exists and is not a directory; choose another directory")
    return path


def make_output_dir(path, what: str, *, root=None) -> str:
    """Create output directory ``path`` (and its parents) if missing, after :func:`check_output_dir`; a
    file-system fault is a one-line error naming ``what`` (the option that gave the path)."""
    path = check_output_dir(path, what, root=root)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise AscendEmuError(f"{what} {path} cannot be created ({os_error_text(e)}); choose another "
                             "directory") from None
    return path


def check_writable(path, what: str = "") -> str:
    """Fail early, in one line, if ``path`` cannot be written as a file."""
    path = check_path(path, f"cannot write {what}".strip() + ":")
    label = f"{what} {path}".strip()
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise AscendEmuError(f"cannot write {label}: directory {d} does not exist; create it first")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise AscendEmuError(f"cannot write {label}: {os_error_text(e)}; give another path") from None
    if stat.S_ISDIR(st.st_mode):
        raise AscendEmuError(f"cannot write {label}: it is a directory; give a file name")
    if stat.S_ISLNK(st.st_mode):
        raise AscendEmuError(f"cannot write {label}: it is a symbolic link, which ascend-emu never replaces; "
                             "give the real path or another name")
    if not stat.S_ISREG(st.st_mode):
        raise AscendEmuError(f"cannot write {label}: it is not a regular file; give another path")
    if not st.st_mode & 0o222:
        raise AscendEmuError(f"cannot write {label}: the file is read-only; make it writable (chmod u+w) "
                             "or give another path")
    return path


def atomic_write_text(path, text: str) -> str:
    """Write ``text`` to ``path`` via a temporary file in the same directory and one rename.

    A missing parent directory, a target that is a directory, a symbolic link or a read-only
    file, and any file-system fault (read-only directory, full disk, file size limit) are a
    one-line :class:`AscendEmuError`; on any failure the temporary file is removed and the
    target is left as it was.
    """
    path = check_writable(path)
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    except OSError as e:
        raise AscendEmuError(f"cannot write {path}: {os_error_text(e)} (in directory {d}); "
                             "give a writable location") from None
    try:
        # mkstemp creates 0600; give the file the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        # the checks above ran before the write; a link or read-only file swapped in meanwhile is refused too
        check_writable(path)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise AscendEmuError(f"cannot write {path}: {os_error_text(e)}; free space or give another "
                                 "location") from None
        raise
    return path
