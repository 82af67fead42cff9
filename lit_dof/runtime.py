"""Process-level CPU runtime settings (nothing here runs at import; the ``lit-dof`` entry point applies them).

On Linux/glibc, tensors above the malloc mmap threshold are returned to the OS on free and page-faulted
(zero-filled) again on the next allocation, and the heap top is trimmed aggressively; raising the thresholds
keeps large buffers mapped between steps (the effect is measured in docs/benchmarks.md with
``scripts/bench_attention.py`` with and without ``--no-tune-allocator``). PyTorch's own
CPU tuning guide recommends jemalloc/tcmalloc for the same reason; raising glibc's thresholds is the
dependency-free equivalent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_cpu_allocator(mmap_threshold: int = 1 << 30, trim_threshold: int = 1 << 32) -> bool:
    """Keep freed tensor memory in the process instead of unmapping it (glibc ``mallopt``).

    Process-wide: call it once from an entry point (the ``lit-dof`` command and the benchmarks do), not from
    library code.
    Equivalent to the environment variables ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``.

    Args:
        mmap_threshold: allocations below this many bytes come from the heap (glibc caps it at 32 MiB
            on some versions; larger values are then ignored, which is harmless).
        trim_threshold: free heap memory above this many bytes is returned to the OS.

    Returns:
        True if both settings were applied; False off glibc (macOS, Windows, musl) or when the user set
        ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` — nothing changes then.
    """
    if not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False  # the user's own glibc settings win
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1))
    trim_ok = mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1))
    return bool(mmap_ok and trim_ok)
