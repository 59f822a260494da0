"""One API request's generations: jobs for the scheduler, their results gathered per choice.

Choice i of prompt p has index p·n + i and seed ``seed + index`` (as ``glassgpt sample``
gives sample i the seed ``seed + i``). Token ids arrive from the scheduler thread through an
asyncio queue; each choice decodes its bytes incrementally (a character split across tokens
waits for its last byte). Leaving :meth:`Run.events` early, by a disconnect or a cancelled
stream, cancels every job, and the scheduler drops them before its next step.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from glassgpt.sample.filters import SamplingConfig
from glassgpt.serve.scheduler import Job, Scheduler


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
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))


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
        self, scheduler: Scheduler, tokenizer: Any, prompts: list[list[int]], s: Settings
    ) -> None:
        self.scheduler, self.tokenizer = scheduler, tokenizer
        self.queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        base = s.seed if s.seed is not None else random.randrange(2**62)
        eos = (getattr(tokenizer, "special_tokens", None) or {}).get("<|endoftext|>")
        n_ctx = scheduler.config.n_ctx
        self.choices: list[Choice] = []
        self.jobs: list[Job] = []
        for p, ids in enumerate(prompts):
            for i in range(s.n):
                index = p * s.n + i
                self.choices.append(Choice(index, ids))
                self.jobs.append(
                    Job(
                        prompt=ids,
                        sampling=s.sampling,
                        max_tokens=s.max_tokens or max(1, n_ctx - len(ids)),
                        seed=base + index,
                        emit=partial(self._emit, loop, index),
                        stop=s.stop,
                        stop_ids=frozenset() if eos is None else frozenset([eos]),
                        logprobs=s.logprobs,
                    )
                )

    def _emit(self, loop: asyncio.AbstractEventLoop, index: int, kind: str, payload: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed (server shutting down)
            loop.call_soon_threadsafe(self.queue.put_nowait, (index, kind, payload))

    async def events(self, request: Any = None) -> AsyncIterator[tuple[Choice, str, str]]:
        """(choice, "token" | "done" | "error", new text) until every choice has finished.

        With ``request``, a client that disconnects ends the run (checked twice a second)."""
        for job in self.jobs:
            self.scheduler.submit(job)
        remaining = len(self.jobs)
        try:
            while remaining:
                try:
                    index, kind, payload = await asyncio.wait_for(
                        self.queue.get(), None if request is None else 0.5
                    )
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                choice = self.choices[index]
                if kind == "token":
                    t, info = payload
                    choice.ids.append(t)
                    choice.infos.append(info)
                    piece = choice.decoder.decode(self.tokenizer.decode_bytes([t]))
                else:
                    remaining -= 1
                    piece = choice.decoder.decode(b"", final=True)
                    if kind == "error":
                        choice.error, choice.finish = payload, "error"
                    else:
                        choice.finish = payload
                choice.text.append(piece)
                yield choice, kind, piece
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop every job (the client has gone); the scheduler drops them before its next step."""
        for job in self.jobs:
            job.cancel()

    async def finish(self, request: Any = None) -> list[Choice]:
        """Every choice, complete."""
        async for _ in self.events(request):
            pass
        return self.choices
