"""One API request's generations: jobs for the scheduler, their results gathered per choice.

Choice i of prompt p has index p·n + i and seed ``seed + index`` (as ``glassgpt sample``
gives sample i the seed ``seed + i``). Token ids arrive from the scheduler thread through an
asyncio queue; each choice's text comes through a :class:`~glassgpt.tokenizer.streaming.TextStream`
(its pieces join to the tokenizer's decode; a completion continues its prompt's text, a chat
``reply`` reads alone). Leaving :meth:`Run.events` early, by a disconnect or a cancelled
stream, cancels every job, and the scheduler drops them before its next step.
"""

from __future__ import annotations

import asyncio
import random
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from glassgpt.sample.filters import SamplingConfig
from glassgpt.serve.scheduler import Job, Scheduler
from glassgpt.tokenizer.special import stop_ids
from glassgpt.tokenizer.streaming import TextStream


class _Mailbox:
    """Results from the scheduler thread into one event loop, one wake-up per batch.

    The scheduler emits an item per sequence per step; waking the loop for each one (a
    self-pipe write and a callback) costs more than the item, and a loop woken in the middle
    of a step takes the GIL from the scheduler to hand on one item. Items wait in a list
    until the scheduler's ``wake`` (the jobs' ``flush``, after each step), which schedules
    one drain that hands them to their queues, in order.

    The self-pipe's write is not the scheduler's: a write lets go of the GIL, and taking it
    back waited for whichever thread took it meanwhile (the prompt thread, the loop): 0.2–0.4
    ms a step under 8 streaming clients, on the steps' own path. ``wake`` releases a lock
    instead (which keeps the GIL) and the mailbox's waker thread, waiting on that lock,
    writes while the scheduler's next step runs its kernels without the GIL."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.lock = loop, threading.Lock()
        self.items: list[tuple[asyncio.Queue[Any], Any]] = []
        self.scheduled = False  # a drain is pending
        # released once per drain scheduled (only while ``scheduled`` turns True, so always
        # held then: the waker took it before the drain it scheduled ran)
        self.bell = threading.Lock()
        self.bell.acquire()
        self.waker = threading.Thread(target=self._wake_loop, name="glassgpt-waker", daemon=True)
        self.waker.start()

    def post(self, queue: asyncio.Queue[Any], item: Any) -> None:
        with self.lock:
            self.items.append((queue, item))

    def wake(self) -> None:
        with self.lock:
            if self.scheduled or not self.items:
                return
            self.scheduled = True
        self.bell.release()

    def _wake_loop(self) -> None:
        """The waker thread: each release of the bell, one drain scheduled on the loop, until the
        loop closes."""
        while not self.loop.is_closed():
            if not self.bell.acquire(timeout=1.0):
                continue
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop has closed (shutting down)
                return

    def _drain(self) -> None:
        with self.lock:
            items, self.items, self.scheduled = self.items, [], False
        for queue, item in items:
            queue.put_nowait(item)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)
_GONE = -1  # the index of the watcher's message: the client has disconnected


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


@dataclass
class Choice:
    """What one choice has produced so far."""

    index: int
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    infos: list[Any] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    decoder: Any = None  # a TextStream


@dataclass(frozen=True)
class Settings:
    """The per-request generation settings (already validated)."""

    sampling: SamplingConfig
    max_tokens: int | None  # None: until the context is full (then the window slides)
    n: int
    seed: int | None
    stop: tuple[str, ...]
    logprobs: int | None


class Run:
    """Submit one job per choice; ``events()`` yields (choice, kind, text piece) as they come."""

    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: Any,
        prompts: list[list[int]],
        s: Settings,
        reply: bool = False,
    ) -> None:
        self.scheduler, self.tokenizer = scheduler, tokenizer
        self.queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        self.mailbox = _mailbox(asyncio.get_running_loop())
        base = s.seed if s.seed is not None else random.randrange(2**62)
        ends = frozenset(stop_ids(tokenizer))  # <|endoftext|>, a family's end-of-turn ids
        n_ctx = scheduler.n_ctx  # the server's context
        self.choices: list[Choice] = []
        self.jobs: list[Job] = []
        for p, ids in enumerate(prompts):
            for i in range(s.n):
                index = p * s.n + i
                stream = TextStream(tokenizer, () if reply else ids)
                self.choices.append(Choice(index, ids, decoder=stream))
                self.jobs.append(
                    Job(
                        prompt=ids,
                        sampling=s.sampling,
                        max_tokens=s.max_tokens or max(1, n_ctx - len(ids)),
                        seed=base + index,
                        emit=partial(self._emit, index),
                        stop=s.stop,
                        stop_ids=ends,
                        logprobs=s.logprobs,
                        flush=self.mailbox.wake,
                    )
                )

    def _emit(self, index: int, kind: str, payload: Any) -> None:
        self.mailbox.post(self.queue, (index, kind, payload))

    async def _watch(self, request: Any) -> None:
        """Twice a second: has the client gone? Then end :meth:`events`."""
        while not await request.is_disconnected():
            await asyncio.sleep(0.5)
        self.queue.put_nowait((_GONE, "gone", None))

    async def events(self, request: Any = None) -> AsyncIterator[tuple[Choice, str, str]]:
        """(choice, "token" | "done" | "error", new text) until every choice has finished.

        With ``request``, a client that disconnects ends the run (checked twice a second)."""
        for job in self.jobs:
            self.scheduler.submit(job)
        remaining = len(self.jobs)
        watcher = None if request is None else asyncio.create_task(self._watch(request))
        try:
            while remaining:
                index, kind, payload = await self.queue.get()
                if index == _GONE:
                    return
                choice = self.choices[index]
                if kind == "token":
                    t, info = payload
                    choice.ids.append(t)
                    choice.infos.append(info)
                    piece = choice.decoder.push(t)
                else:
                    remaining -= 1
                    piece = choice.decoder.flush()
                    if kind == "error":
                        choice.error, choice.finish = payload, "error"
                    else:
                        choice.finish = payload
                choice.text.append(piece)
                yield choice, kind, piece
        finally:
            if watcher is not None:
                watcher.cancel()
            self.cancel()

    @property
    def ready(self) -> bool:
        """Whether :meth:`events` has more to give without waiting (or has ended)."""
        return not self.queue.empty() or all(c.finish is not None for c in self.choices)

    def cancel(self) -> None:
        """Stop every job (the client has gone); the scheduler drops them before its next step."""
        for job in self.jobs:
            job.cancel()

    async def finish(self, request: Any = None) -> list[Choice]:
        """Every choice, complete."""
        async for _ in self.events(request):
            pass
        return self.choices
