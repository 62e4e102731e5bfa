"""Optional numba: `njit` compiles when numba is importable and is a no-op otherwise.

The draft-source cores and the decoder's top-k kernel are written in the subset of Python
that numba compiles, over preallocated numpy arrays, so they run unchanged as plain Python
(slower, same results) when numba is missing. Set DRAFTLESS_NO_NUMBA=1 to force the
plain-Python path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

HAVE_NUMBA = False
_numba_njit: Any = None
if os.environ.get("DRAFTLESS_NO_NUMBA", "") in ("", "0"):
    try:
        from numba import njit as _numba_njit

        HAVE_NUMBA = True
    except ImportError:  # numba is an optional extra ("fast")
        pass


def njit(fn: F) -> F:
    """Compile `fn` with numba (nopython, cached on disk) if available, else return it as is."""
    if HAVE_NUMBA:
        compiled: F = _numba_njit(cache=True, nogil=True)(fn)
        return compiled
    return fn
