"""One OpenMP thread for one Python thread's PyTorch operations: the server's sampling and its
prompt thread.

The server has two threads that compute at once (the scheduler's steps and the prompt
thread's forwards) and an event loop beside them. A PyTorch operation that parts its rows
over the OpenMP team (``torch.softmax`` of a step's [8, V] rows does) waits at its join for
a worker whose core is busy with the other thread: on 2 cores under 8 streaming clients the
sampler's float64 softmax of [8, 65] took 0.3–0.6 ms a step that way, against 3 µs on the
caller alone. OpenMP's thread count is per thread (its ``nthreads-var``, which
``torch.get_num_threads`` reads on the calling thread), so :func:`one_thread` sets it to 1 on
the calling thread only, for a ``with`` block. (The prompt thread keeps its team: with one
thread its forwards held up the steps more, once the products took 8 rows a pass: 1,563 and
1,589 against 1,655 and 1,661 tokens/s at 8 clients.) Every row's result is its own whatever
the team (each of these operations gives a row to one thread), so the bits do not change;
``tests/serve/test_cores.py`` checks that.

PyTorch sets a thread's count once, at its first parallel operation there (to
``torch.set_num_threads``'s, or MKL's): ``torch.get_num_threads`` makes that happen first,
so the 1 set here is not undone by it.

The runtime is the OpenMP library PyTorch loaded (libgomp, libiomp5 or libomp), found among
the process's mapped files (Linux's ``/proc/self/maps``); elsewhere :func:`one_thread` does
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

_NAMES = ("libgomp", "libiomp", "libomp")


@functools.cache
def runtime() -> Any | None:
    """The OpenMP library PyTorch loaded (a ``ctypes.PyDLL``), or None where none is found.

    A process may have several loaded (wheels bundle their own libgomp: scikit-learn's,
    CTranslate2's and sentencepiece's beside PyTorch's), and a count set through another
    one's ``omp_set_num_threads`` does not reach PyTorch's team. So each is tried: the one
    whose count ``torch.get_num_threads`` (PyTorch's ``omp_get_max_threads``) then reads is
    PyTorch's, and every count is put back."""
    if not torch.backends.openmp.is_available():  # (importing torch loaded it, if any)
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = dict.fromkeys(
        f[-1] for f in (line.split() for line in maps.splitlines())
        if len(f) >= 6 and Path(f[-1]).name.startswith(_NAMES)
    )  # fmt: skip
    n = torch.get_num_threads()  # (PyTorch's first look at this thread made first)
    for path in paths:
        with contextlib.suppress(OSError, AttributeError):
            # already loaded: the same handle; PyDLL keeps the GIL across a call (a
            # CDLL call lets go of it, and taking it back waits for whichever thread
            # took it meanwhile)
            lib = ctypes.PyDLL(path)
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            lib.omp_get_max_threads.restype = ctypes.c_int
            own = lib.omp_get_max_threads()
            lib.omp_set_num_threads(n + 1)
            took = torch.get_num_threads() == n + 1
            lib.omp_set_num_threads(n if took else own)
            if took:
                return lib
    return None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch's operations on this thread run on it alone inside the block (other threads
    keep their teams)."""
    lib = runtime()
    if lib is None:
        yield
        return
    n = torch.get_num_threads()  # (after PyTorch's first look on this thread: see below)
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(n)
