"""Recording a decoding step's kernel calls, for replay without the Python between them.

A float32 decoding step on a CPU is, underneath the model's Python, a fixed sequence of
glassgpt's compiled kernels (``_gemv``, ``_rowwise``, ``_attend``, ``_int8``) on fixed
buffers: the weights, the KV cache, and the step's activations. Only the position n moves:
the cache column written, the keys attended to (n + 1) and the position row added to the
embedding. A :class:`Recorder` collects that sequence while one step runs eagerly:

- each kernel seam reports its compiled call (the function and its integer arguments,
  addresses included) through :func:`add` while ``RECORDING``, naming the arguments that
  are positions; calls from other threads go to their own recorders, if any;
- every PyTorch operation of the step passes through :class:`StepMode`, which keeps every
  tensor the step allocates alive (so that the addresses stay valid), lets views and
  allocations through, records a float32 ``a + b`` (``a * b``) of two contiguous tensors of
  one shape as ``_rowwise.add`` (``_rowwise.mul``), a tensor's division, product or tanh by
  numbers as PyTorch's own kernel into the same buffer, lets through an operation that reads only
  constants (the model's parameters, or what such operations made of them, say Gemma's
  gain 1 + w: the same at every step, so computed once), and marks the recording unusable
  on anything else (it then names the operation).

Replaying the calls with the positions moved computes exactly what the eager step would
have: the same kernels on the same buffers in the same order (see
``glassgpt.sample.replay``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from glassgpt.kernels.extensions import extension

_rowwise = extension("_rowwise")  # not built: nothing can be recorded (the seams call no kernel)

Call = tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]  # fn, args, position args


class Recorder:
    """The compiled calls of one step at position ``position``: ``calls`` holds (fn, args,
    positional) with each argument index in ``positional`` stored relative to the position;
    ``failed`` names the first operation that could not be recorded (None while all could)."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.calls: list[Call] = []
        self.keep: list[Any] = []  # tensors whose memory the recorded addresses point into
        self.failed: str | None = None

    def add(
        self, fn: Callable[..., Any], args: Sequence[Any], positional: Sequence[int] = ()
    ) -> None:
        rel = list(args)
        for i in positional:
            rel[i] -= self.position
        self.calls.append((fn, tuple(rel), tuple(positional)))

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why


RECORDING = 0  # recordings in progress, in any thread: the seams' one cheap test
_lock = threading.Lock()
_local = threading.local()  # .recorder: this thread's Recorder, if it is recording


def start(recorder: Recorder) -> None:
    """Report this thread's compiled calls to ``recorder`` until :func:`stop`."""
    global RECORDING
    with _lock:
        _local.recorder = recorder
        RECORDING += 1


def stop() -> None:
    """End this thread's recording (if any)."""
    global RECORDING
    with _lock:
        if getattr(_local, "recorder", None) is not None:
            _local.recorder = None
            RECORDING -= 1


def add(fn: Callable[..., Any], args: Sequence[Any], positional: Sequence[int] = ()) -> None:
    """A compiled call just made, ``fn(*args)``, for this thread's recorder (if any); the
    arguments at the indices ``positional`` are positions (cache columns, key counts)."""
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.add(fn, args, positional)


def fail(why: str) -> None:
    """This thread's recording (if any) cannot be replayed: ``why``."""
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.fail(why)


_ALLOCATIONS = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"))


def embed_call(args: tuple[int, ...], positional: tuple[int, ...]) -> Call:
    """The compiled embedding x₀ = W_E[token] + P[n] (``_rowwise.embed``) as a recorded call
    on ``args`` (addresses and sizes), ``positional`` naming the arguments that move with n."""
    assert _rowwise is not None
    return (_rowwise.embed, args, positional)


def scale_call(address: int, n: int, factor: float) -> Call:
    """The compiled x ← factor · x over n float32 values at ``address`` (``_rowwise``'s
    ``scale_many``, one thread: float32(factor) · x, each product rounded once, as PyTorch's
    float32 tensor times a Python float) as a recorded call: a replayed step's s · W_E[t]."""
    assert _rowwise is not None
    return (_rowwise.scale_many, ((address,), (n,), factor, 1), ())


def take_rows_call(args: tuple[int, ...], positional: tuple[int, ...]) -> Call:
    """The compiled y[b] = table[p] (``_rowwise.take_rows``: a replayed step's RoPE cos or sin
    at its position) as a recorded call on ``args``, ``positional`` naming what moves with n."""
    assert _rowwise is not None
    return (_rowwise.take_rows, args, positional)


def argmax_at(address: int, rows: int, n: int, stride: int) -> list[int] | None:
    """Each of ``rows`` float32 rows' argmax over its first ``n`` values (rows ``stride``
    apart at ``address``); None where a row holds a NaN or an infinite maximum."""
    assert _rowwise is not None
    return _rowwise.argmax_rows(address, rows, n, stride)


class StepMode(TorchDispatchMode):
    """Every PyTorch operation of a recorded step (see the module docstring); ``active`` off
    lets operations through unseen (the step's prologue, the embedding)."""

    def __init__(self, recorder: Recorder, constants: set[int] | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.active = False
        self.constants = set() if constants is None else constants  # their storages' addresses

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: ``__torch_dispatch__`` is not wrapped to disable dynamo (the wrapper imports
        ``torch._dynamo`` at the mode's first operation, on a process's first decoding, which no compiled code here needs; a recording never runs under
        ``torch.compile``)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self.active:
            return out
        rec = self.recorder
        rec.keep.append(out)
        name = func.overloadpacket.__name__
        if func.is_view or name in _ALLOCATIONS:
            return out
        if func in _ELEMENTWISE and _plain_sum(args, kwargs, out):
            a, b = args
            fn = _rowwise.add if func is torch.ops.aten.add.Tensor else _rowwise.mul
            rec.add(fn, (a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel()))
            return out
        if self._of_constants(args, kwargs) and isinstance(out, torch.Tensor):
            self.constants.add(out.untyped_storage().data_ptr())  # (kept alive above)
            return out
        if func in _POINTWISE and _plain_pointwise(args, kwargs, out):
            rec.add(_pytorch_out(_POINTWISE[func], args, out), ())
            return out
        rec.fail(f"aten.{name}")
        return out

    def _of_constants(self, args: Any, kwargs: Any) -> bool:
        """Whether every tensor among the arguments is a constant (and there is one)."""
        tensors = [t for t in (*args, *(kwargs or {}).values()) if isinstance(t, torch.Tensor)]
        constants = self.constants
        return bool(tensors) and all(t.untyped_storage().data_ptr() in constants for t in tensors)


_ELEMENTWISE = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
# A tensor and numbers in, replayed by PyTorch's own kernel into the recorded buffer (the
# same bits): a soft cap's c · tanh(z / c) on the logits.
_POINTWISE = {
    torch.ops.aten.div.Tensor: torch.ops.aten.div.out,
    torch.ops.aten.mul.Tensor: torch.ops.aten.mul.out,
    torch.ops.aten.tanh.default: torch.ops.aten.tanh.out,
}


def _plain_pointwise(args: Any, kwargs: Any, out: Any) -> bool:
    """Whether the op reads one contiguous float32 CPU tensor of the output's shape and
    numbers (no other tensor)."""
    if kwargs or not args or not isinstance(out, torch.Tensor):
        return False
    x, *rest = args
    return (
        isinstance(x, torch.Tensor) and x.dtype is torch.float32 and x.is_cpu
        and x.is_contiguous() and x.shape == out.shape and out.is_contiguous()
        and all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rest)
    )  # fmt: skip


def _pytorch_out(op: Any, args: Any, out: torch.Tensor) -> Callable[[], Any]:
    """op(*args, out=out) in inference mode (the recording's buffers are inference tensors)."""

    def call() -> None:
        with torch.inference_mode():
            op(*args, out=out)

    return call


def _plain_sum(args: Any, kwargs: Any, out: Any) -> bool:
    """Whether ``a + b`` (``a * b``) is two contiguous float32 CPU tensors of one shape (no
    alpha)."""
    if _rowwise is None or kwargs or len(args) != 2:
        return False
    a, b = args
    return all(
        isinstance(t, torch.Tensor) and t.dtype is torch.float32 and t.is_cpu
        and t.is_contiguous() and t.shape == out.shape
        for t in (a, b, out)
    )  # fmt: skip
