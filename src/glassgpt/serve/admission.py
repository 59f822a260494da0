"""The scheduler's prompt side: requests admitted into slots, their prompts encoded.

    admit   the waiting requests, as many as there are free slots, sorted by the cached
            prefix each loads (``serve.prefix``) and by length: their prompts written
            straight into free slots, neighbours that loaded as many cached positions sharing
            one forward over their common length, and their first tokens sampled in one pass
    beside  while other sequences decode (on a CPU, the model plain), the prompts go to the
            prompt thread (``launch``) and the steps go on; the step after their forward
            has ended starts them (``land``), in the slots after the active ones
    slide   a sequence whose context is full re-encodes its last ⌊3·C/4⌋ tokens alone

A prompt costs several of a step's forwards (a prompt of 33 tokens about three steps of 8
rows), and while it was encoded on the scheduler's thread every sequence waited for it. On
the prompt thread its forward takes the time of the other core: its slots are not the
steps' slots, the steps hold ``lock.step`` and the prompts ``lock.prompt``
(:class:`ModelLock`), and an analysis that holds ``lock`` has the model to itself. A step of
a new batch size is recorded (``glassgpt.sample.replay``) with no prompt in flight: the
recording's pre-hook on the model's first block would catch the prompt's forward too.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from glassgpt.kernels import PANEL_BLOCK_ROWS
from glassgpt.sample.rows import Rows
from glassgpt.serve.prefix import PrefixCache
from glassgpt.serve.slots import SlotCache

if TYPE_CHECKING:
    from glassgpt.serve.scheduler import Job

# the most rows of tokens (prompts × their length) one admission forward takes. Up to this many,
# packed float32 weights take the panels in row blocks (kernels.dense), where a row's sums are
# its own whatever the rows beside it: prompts encoded together then give each prompt's logits,
# keys and values bit for bit as alone (a request's tokens do not depend on its neighbours).
PREFILL_TOKENS = PANEL_BLOCK_ROWS


class ModelLock:
    """The scheduler's two locks, taken in turn by ``with``: what an analysis holds to have
    the model to itself. The scheduler's steps take ``step`` and its prompts ``prompt``, so
    that a prompt on the prompt thread and a step (other slots) run at once."""

    def __init__(self) -> None:
        self.step, self.prompt = threading.Lock(), threading.Lock()

    def __enter__(self) -> ModelLock:
        self.step.acquire()
        self.prompt.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.prompt.release()
        self.step.release()


@dataclass
class Flight:
    """Prompts being encoded on the prompt thread into slots start.. while the steps go on."""

    future: Future[tuple[Tensor, list[Any]]]  # (logits [k, V], their caches)
    jobs: list[Job]
    start: int


class Admission:
    """The prompt side of :class:`glassgpt.serve.scheduler.Scheduler` (its state is the
    scheduler's: the slots, the sampler's rows, the prefix cache, the lock)."""

    active: list[Any]  # the decoding sequences, active[b] in slot b
    cache: SlotCache
    rows: Rows
    prefix: PrefixCache
    lock: ModelLock
    decoding: Any  # the model the forwards run on
    steering: dict[str, Any]
    device: torch.device
    n_ctx: int
    admitting: Job | None
    admitted: list[Job]
    prompt_forwards: int
    overlapped: int
    flight: Flight | None
    _prompts: ThreadPoolExecutor | None

    def _plain(self) -> bool:
        """Whether the model decodes as it is (no steering, no hooks attached)."""
        return not self.steering and not self.decoding._hook_fns

    def _sorted(self, jobs: list[Job]) -> list[Job]:
        """Prompts that load prefixes of the same length side by side, shortest first."""
        return sorted(jobs, key=lambda j: (self.prefix.match(j.prompt), len(j.prompt)))

    def _launch(self, jobs: list[Job]) -> None:
        """``jobs``' prompts encoded into the slots after the active ones on the prompt
        thread, while this thread steps the active sequences; :meth:`_land` starts them."""
        start, jobs = len(self.active), self._sorted(jobs)
        try:
            for b, job in enumerate(jobs):
                self.rows.set(start + b, job.sampling, job.seed, job.prompt)
        except Exception:  # (a bad setting: each job then meets its own error alone)
            try:
                self._admit_all(jobs)
            finally:
                self.admitted = []
            return
        assert self._prompts is not None
        self.admitted, self.admitting = jobs, jobs[0]
        future = self._prompts.submit(self._encode_many, [j.prompt for j in jobs], start)
        self.flight = Flight(future, jobs, start)

    def _land(self) -> None:
        """The prompts in flight, once encoded (waiting for them): moved down to the slots
        after the active ones (sequences may have ended meanwhile) and started; retried one
        by one if their forward failed."""
        flight, self.flight = self.flight, None
        assert flight is not None
        jobs, start = flight.jobs, flight.start
        try:
            try:
                logits, caches = flight.future.result()
            except Exception:
                for job in jobs:
                    self._guarded([job], self._admit)
                return
            here = len(self.active)
            for b, c in enumerate(caches):
                self.cache.admit(start + b, c)
                if here < start:
                    self.cache.move(start + b, here + b)
                    self.rows.move(start + b, here + b)
            self.overlapped += 1
            self._guarded(jobs, lambda _: self._start(jobs, logits, here))
        finally:
            self.admitted, self.admitting = [], None

    def _admit_all(self, jobs: list[Job]) -> None:
        """Admit ``jobs`` (as many as there are free slots) on this thread: together where
        the model is plain (their prompts' common stretch in one forward, ``_prefill_many``),
        else (hooks, steering) one after another; a batch whose forward fails is retried one
        by one."""
        if len(jobs) > 1 and self._plain():
            start = len(self.active)
            jobs = self._sorted(jobs)
            self.admitting = jobs[0]
            try:
                for b, job in enumerate(jobs):
                    self.rows.set(start + b, job.sampling, job.seed, job.prompt)
                logits = self._prefill_many([j.prompt for j in jobs], start)
            except Exception:
                logits = None  # (each job then meets its own error alone)
            finally:
                self.admitting = None
            if logits is not None:
                self._guarded(jobs, lambda _: self._start(jobs, logits, start))
                return
        for job in jobs:
            self._guarded([job], self._admit)

    def _admit(self, jobs: list[Job]) -> None:
        (job,) = jobs
        slot = len(self.active)
        self.rows.set(slot, job.sampling, job.seed, job.prompt)
        self.admitting = job
        try:
            logits = self._prefill(job.prompt, slot)
        finally:
            self.admitting = None
        self._start([job], logits[None], slot)

    def _slide(self, b: int) -> None:
        """The context is full: re-encode the last ``window`` tokens of slot b's sequence
        (as ``generate`` slides, window = ⌊3·C/4⌋) and sample from their logits."""
        seq = self.active[b]
        window = seq.history[-max(1, 3 * self.n_ctx // 4) :]
        logits = self._prefill(window, b)
        if self._sample([seq], logits[None], b)[0]:
            self._free(b)

    def _prefill(self, ids: list[int], slot: int) -> Tensor:
        """``ids`` encoded alone into ``slot`` (its keys and values written in place, as a
        new ``KVCache`` would hold them): the logits [V] after the last one. A cached prefix
        (``serve.prefix``) is loaded, not encoded; not with steering, whose hooks change the
        keys and values."""
        model = self.decoding
        cache = self.cache.prompt_cache(slot, model)
        with self.lock.prompt, torch.inference_mode(), self.steered():
            plain = self._plain()
            n = self.prefix.load(ids, cache) if plain else 0
            tokens = torch.tensor([ids[n:]], dtype=torch.long, device=self.device)
            logits = model(tokens, cache=cache)  # [1, 1, V]
            self.prompt_forwards += 1
            if plain:
                self.prefix.store(ids, cache)
        self.cache.admit(slot, cache)
        return logits[0, -1]

    def _prefill_many(self, prompts: list[list[int]], start: int) -> Tensor:
        """``prompts`` encoded into slots start.. and admitted there (``_encode_many``): the
        logits [k, V] after each."""
        logits, caches = self._encode_many(prompts, start)
        for b, c in enumerate(caches):
            self.cache.admit(start + b, c)
        return logits

    def _encode_many(self, prompts: list[list[int]], start: int) -> tuple[Tensor, list[Any]]:
        """``prompts`` encoded into slots start.. (a plain model; sorted by the prefix each
        loads, then by length): the logits [k, V] after each and the caches holding them.
        Each loads its cached prefix (``serve.prefix``); then neighbouring prompts that
        loaded as many positions n and have as many m left go through one forward of those
        m tokens (a power of two of them, at most ``PREFILL_TOKENS`` rows of tokens), the
        others each alone. A forward costs one read of the weights plus its tokens'
        products, so k such prompts cost one read, not k; each is the forward it would take
        alone (the same positions, n to n + m), so with row-independent products
        (``PREFILL_TOKENS``) its results are its own, bit for bit."""
        model, k = self.decoding, len(prompts)
        caches = [self.cache.prompt_cache(start + b, model) for b in range(k)]
        out: list[Tensor] = [torch.empty(0)] * k
        with self.lock.prompt, torch.inference_mode():
            done = [self.prefix.load(ids, c) for ids, c in zip(prompts, caches)]
            b = 0
            while b < k:  # prompts b.. that loaded n positions and have m tokens left
                n, m = done[b], len(prompts[b]) - done[b]
                e = b + 1
                while (e < k and done[e] == n and len(prompts[e]) - n == m
                       and (e + 1 - b) * m <= PREFILL_TOKENS):  # fmt: skip
                    e += 1
                # a power of two of rows: oneDNN makes (and keeps) a primitive for each new
                # number of rows a product takes past 32, ~2 MB and a JIT compile each
                e = b + (1 << ((e - b).bit_length() - 1))
                many = self.cache.prompt_cache(start + b, model, rows=e - b) if e - b > 1 \
                    else caches[b]  # fmt: skip
                many.length = n
                tokens = torch.tensor([prompts[i][n:] for i in range(b, e)], dtype=torch.long,
                                      device=self.device)  # fmt: skip
                logits = model(tokens, cache=many)[:, -1]  # [e − b, V]
                self.prompt_forwards += 1
                for i in range(b, e):
                    caches[i].length = len(prompts[i])
                    out[i] = logits[i - b]
                b = e
            for ids, c in zip(prompts, caches):
                self.prefix.store(ids, c)
        return torch.stack(out), caches
