"""Running out of memory, told as such: the CLI's one line when an error is a memory shortage in disguise.

Under an address-space limit (``ulimit -v``, RLIMIT_AS) Python raises MemoryError, but TensorFlow and the
loader below it fail otherwise: a shared library cannot be mapped while TensorFlow imports ("failed to map
segment from shared object"), a thread cannot get its stack while a function is frozen (EAGAIN, "Resource
temporarily unavailable", which the loader reports as "cannot freeze function ..."), an allocator throws
``std::bad_alloc``. Each of those read as a fault of the model or of the installation; :func:`out_of_memory_line`
recognises them and says what ran out and what to do instead.
"""
from __future__ import annotations

import resource

#: texts that only a memory shortage produces
_ALWAYS = ("failed to map segment from shared object", "std::bad_alloc", "cannot allocate memory",
           "oom when allocating", "resourceexhaustederror", "out of memory")
#: texts that a memory limit produces (a thread or a mapping refused) but other faults can too: read as a
#: memory shortage only while a limit is set
_UNDER_LIMIT = ("resource temporarily unavailable", "thread creation failed", "can't start new thread")

_ADVICE = ("a smaller batch (--batch-size) or input (--shape), statistics only (--stats-only), fewer dumped "
           "steps or tensors (--dump-steps, --select)")


def memory_limit() -> int | None:
    """The process's address-space (or data) limit in bytes, None when unlimited."""
    limits = []
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft, _ = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    return min(limits) if limits else None


def _texts(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e, f"{type(e).__name__}: {e}".lower()
        e = e.__cause__ or e.__context__


def out_of_memory_line(e: BaseException) -> str | None:
    """The one line (without the ``ascend-emu: error:`` prefix) for an error that is a memory shortage, or None."""
    limit = memory_limit()
    hit = None
    for exc, text in _texts(e):
        if isinstance(exc, MemoryError) or any(m in text for m in _ALWAYS) or (
                limit is not None and any(m in text for m in _UNDER_LIMIT)):
            hit = exc
            break
    if hit is None:
        return None
    where = (f"the process may use {limit / 2 ** 30:.2f} GiB of address space (ulimit -v) and that ran out"
             if limit is not None else "the machine's memory ran out")
    return (f"out of memory: {where} ({str(hit).splitlines()[0][:160] if str(hit) else type(hit).__name__}); "
            f"raise the limit or free memory, or use {_ADVICE}")
