"""Continuous batching: one thread decodes every active sequence in one forward per step.

    loop:  admit   the new requests, as many as there are free slots: their prompts written
                   straight into free slots, prompts that loaded as many cached positions
                   sharing one forward over their common length (then each its rest), and
                   their first tokens sampled in one pass; while other sequences decode, the
                   prompts are encoded on the prompt thread and the steps go on meanwhile
                   (``serve.admission``)
           step    feed every active sequence its last token in one batch [B, 1]
                   (``SlotCache``: each row at its own position), sample one token per row
           slide   a sequence whose context is full re-encodes its last ⌊3·C/4⌋ tokens (C: the
                   server's context, at most n_ctx; ``serve.slots.served_context``)
                   alone (as ``generate`` slides its window) and samples from them
           retire  sequences that stopped, ran out of tokens or were cancelled free their slot

Each sequence samples with its own settings and its own random stream, through the sampler
``glassgpt.sample.generate`` uses (``glassgpt.sample.rows.Rows``: penalties, logit bias,
temperature, top-k, top-p, min-p on float32 logits; one uniform per token from the stream of
the job's seed). Row b of the sampler is slot b: a step samples every row in one pass of
tensor operations over the batch, whatever the mix of settings, and each operation acts on
each row alone, so a request gives the tokens ``generate`` gives for the same prompt and
seed, whether it runs alone or beside others (up to the float rounding of a batched matmul).

Results go back through a callback (the API hands them to its asyncio queue); after each
admission and each step the scheduler calls the jobs' ``flush``, so the receiving event
loop wakes once per batch of results, not once per token. A cancelled sequence (the client
went away) is dropped before the next step, so no work continues.
A prompt that begins with blocks of tokens an earlier prompt began with (a shared system
prompt) loads their keys and values instead of encoding them (``serve.prefix``).
The explorer's analyses hold ``lock`` (a :class:`ModelLock`: hooks are per model), which
excludes every forward of the scheduler: its steps hold ``lock.step``, its prompts
``lock.prompt``, so that a prompt can be encoded on the prompt thread while a step runs.
Steering hooks (``steering``, e.g. from ``glassgpt.sample.steering.steering_hooks``) are
attached around each of the scheduler's forwards, so every request is steered and the
explorer's analyses, which hold the lock between them, see the model as it is.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassgpt.kernels import cache_dtype
from glassgpt.sample import engine
from glassgpt.sample.filters import SamplingConfig, mask_padded
from glassgpt.sample.rows import Rows
from glassgpt.sample.stops import StopMatcher
from glassgpt.serve.admission import Admission, Flight, ModelLock
from glassgpt.serve.cores import one_thread
from glassgpt.serve.prefix import DEFAULT_BYTES, PrefixCache
from glassgpt.serve.slots import SlotCache, available_memory, served_context

Emit = Callable[[str, Any], None]  # ("token", (id, info)) | ("done", reason) | ("error", text)
NO_FINITE = "the model produced no finite logits (NaN or inf weights?)"


def _no_flush() -> None:
    pass


@dataclass
class Job:
    """One sequence to generate: its prompt, settings and where its results go."""

    prompt: list[int]
    sampling: SamplingConfig
    max_tokens: int
    seed: int
    emit: Emit
    stop: Sequence[str] = ()
    stop_ids: frozenset[int] = frozenset()
    logprobs: int | None = None  # top alternatives to report per token (None: no logprobs)
    flush: Callable[[], None] = _no_flush  # after a batch of emits: deliver them
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class _Seq:
    """A job being decoded: its stop matcher and the token to feed next (its sampling state
    is its slot's row of the scheduler's ``Rows``)."""

    def __init__(self, job: Job, tokenizer: Any) -> None:
        self.job = job
        self.matcher = StopMatcher(tokenizer, job.stop) if job.stop else None
        self.made = 0  # tokens sampled so far
        self.history = list(job.prompt)  # every token so far (prompt + sampled)
        self.pending = 0  # the last sampled token, not yet fed
        self.infos: list[tuple[int, Any]] = []  # (id, logprob info) sampled, not yet released


class Scheduler(Admission):
    """Owns the model while serving; ``submit`` jobs from any thread."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        slots: int = 16,
        replay: bool = True,
        steering: Mapping[str, Callable[..., Any]] | None = None,
        max_context: int | None = None,
        prefix_bytes: int | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.steering = dict(steering or {})  # hooks attached around every forward
        self.config = model.config
        # the model the steps and prompts run on: a bf16 CPU model's decoding copy (float32
        # activations over its bf16 weights, replayed, as generate decodes it); with steering,
        # whose hooks go on ``model``, the model itself
        self.decoding = model if self.steering else engine.decoding_model(model, replay=replay)
        p = next(self.decoding.parameters())
        self.device = p.device
        self.n_valid = min(self.config.n_vocab, getattr(tokenizer, "n_vocab", 10**12))
        dtype = cache_dtype(p.dtype, p.device)
        # the server's context C ≤ n_ctx: what each slot holds, the longest prompt, the window
        self.n_ctx = served_context(self.config, slots, max_context, dtype=dtype,
                                    available=None if max_context else available_memory(p.device))  # fmt: skip
        self.cache = SlotCache.for_model(self.decoding, slots, self.n_ctx)
        self.rows = Rows(slots, self.config.n_vocab, self.device)  # row b: slot b's sampling
        if prefix_bytes is None:  # a quarter of the slots' memory, at most DEFAULT_BYTES
            held = sum(2 * layer.k.numel() * layer.k.element_size() for layer in self.cache.layers)
            prefix_bytes = min(DEFAULT_BYTES, held // 4)
        self.prefix = PrefixCache.for_model(
            self.decoding, max_bytes=prefix_bytes
        )  # prompt blocks seen
        self.lock = ModelLock()
        self.inbox: queue.Queue[Job | None] = queue.Queue()
        self.active: list[_Seq] = []  # active[b] lives in slot b
        self.waiting: list[Job] = []  # received, not yet admitted
        self.steps = 0  # batched decode steps so far (for tests and stats)
        self.prompt_forwards = 0  # forwards that encoded prompts (several share one)
        self.replay = replay
        # per batch size B: its decoding engine (glassgpt.sample.engine), chosen at its first step
        self.decoders: dict[int, engine.Decoder] = {}
        self.widest = 0  # the largest batch decoded in one step
        self.dropped = 0  # sequences ended because their client went away
        self.admitting: Job | None = None  # the (first) job being prefilled now
        self.admitted: list[Job] = []  # the jobs being admitted now, together
        self._flushes: set[Callable[[], None]] = set()  # of jobs that emitted since the last
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._prompts: ThreadPoolExecutor | None = None  # the prompt thread (while started)
        self.flight: Flight | None = None  # prompts being encoded there now
        self.overlapped = 0  # prompt batches encoded while steps went on (for tests and stats)

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._prompts = ThreadPoolExecutor(
            1, initializer=os_thread_name, initargs=("glassgpt-prompt",)
        )
        self._thread = threading.Thread(target=self._run, name="glassgpt-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._prompts is not None:
            self._prompts.shutdown(wait=True)

    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    @property
    def busy(self) -> int:
        """Sequences being decoded now."""
        return len(self.active)

    @property
    def pending(self) -> int:
        """Jobs received and not yet decoding: in the inbox, waiting, or being admitted."""
        return self.inbox.qsize() + len(self.waiting) + len(self.admitted)

    def steered(self) -> AbstractContextManager[Any]:
        """The steering hooks attached for a ``with`` block (none: nothing attached)."""
        return self.model.hooks(self.steering)

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        os_thread_name("glassgpt-sched")
        waiting = self.waiting
        while not self._stop.is_set():
            block = not self.active and not waiting and self.flight is None
            try:
                item = self.inbox.get(block=block, timeout=0.5 if block else None)
                while True:
                    if item is not None:
                        waiting.append(item)
                    item = self.inbox.get_nowait()
            except queue.Empty:
                pass
            self._retire_cancelled()
            self.dropped += sum(j.cancelled.is_set() for j in waiting)
            waiting[:] = [j for j in waiting if not j.cancelled.is_set()]
            if self.flight is not None and (self.flight.future.done() or not self.active):
                self._land()  # (waiting for it when nothing else decodes)
            free = self.cache.slots - len(self.active)
            if waiting and free and self.flight is None:
                self.admitted, waiting[:] = waiting[:free], waiting[free:]
                if self._beside():
                    self._launch(self.admitted)  # encoded beside the steps
                else:
                    try:
                        self._admit_all(self.admitted)
                    finally:
                        self.admitted = []
            if self.flight is not None and not self._may_step_beside():
                self._land()
            lengths = self.cache.lengths_of(len(self.active))
            for b in reversed(range(len(lengths))):  # _free(b) moves a later one into b
                if lengths[b] >= self.n_ctx:  # no room for the next feed
                    self._guarded([self.active[b].job], lambda _, b=b: self._slide(b))
            if self.active:
                self._guarded(None, lambda _: self._step())

    def _beside(self) -> bool:
        """Whether prompts go to the prompt thread now: other sequences decode, on a CPU (a
        GPU runs one stream's kernels one after another anyway, and its steps are graphs
        captured on this thread), with the model as it is (no steering, no hooks)."""
        return (bool(self.active) and self._prompts is not None and self.device.type == "cpu"
                and self._plain())  # fmt: skip

    def _may_step_beside(self) -> bool:
        """Whether the next step may run while prompts are in flight: not a step of a new
        batch size, which is recorded (``glassgpt.sample.replay``: the recording's pre-hook on
        the model's first block would catch the prompt thread's forward too), nor a slide
        (encoded on this thread, and reading the prefix cache)."""
        B = len(self.active)
        return B in self.decoders and max(self.cache.lengths_of(B), default=0) < self.n_ctx

    def _guarded(self, jobs: list[Job] | None, fn: Callable[[Any], None]) -> None:
        """Run ``fn(jobs)``; an exception ends the affected sequences (``jobs``, or every
        active one for None) with an error, not the loop."""
        try:
            fn(jobs)
        except Exception as e:  # reported to the clients, never raised into the thread
            message = str(e).splitlines()[0] if str(e) else type(e).__name__
            victims = jobs if jobs is not None else [s.job for s in self.active]
            if jobs is None:
                self.active.clear()
            else:
                mine = {id(j) for j in jobs}
                for b in reversed([b for b, s in enumerate(self.active) if id(s.job) in mine]):
                    self._free(b)
            for j in victims:
                self._emit(j, "error", message)
        flushes, self._flushes = self._flushes, set()
        for flush in flushes:
            flush()

    def _emit(self, job: Job, kind: str, payload: Any) -> None:
        job.emit(kind, payload)
        self._flushes.add(job.flush)

    def _start(self, jobs: list[Job], logits: Tensor, start: int) -> None:
        """Jobs prefilled into slots start.. (``logits`` [k, V] after their prompts): draw
        their first tokens in one pass and keep those that go on."""
        seqs = [_Seq(job, self.tokenizer) for job in jobs]
        finished = self._sample(seqs, logits, start)
        self.active.extend(seqs)
        for b in reversed(range(len(seqs))):
            if finished[b]:
                self._free(start + b)

    def _step(self) -> None:
        B = len(self.active)
        self.widest = max(self.widest, B)
        fed = [s.pending for s in self.active]  # (a replayed step reads a list: no tensor)
        with self.lock.step, torch.inference_mode(), self.steered():
            logits = self._forward(fed)  # [B, 1, V]
        self.steps += 1
        finished = self._sample(self.active, logits[:, -1])
        for b in reversed(range(B)):
            if finished[b]:
                self._free(b)

    def _forward(self, fed: list[int]) -> Tensor:
        """The step's logits by this batch size's decoding engine, chosen as ``generate``
        chooses it (``glassgpt.sample.engine``): on a CPU replayed from the step recorded
        for B (the same logits bit for bit), else the model's forward (hooks attached, say by
        the explorer or steering, decode eagerly)."""
        B, model = len(fed), self.decoding
        decoder = self.decoders.get(B)
        if decoder is None:
            if model._hook_fns:  # choose when the model is as it is between requests
                return model(torch.tensor(fed, device=self.device)[:, None], cache=self.cache)
            choice = engine.choose(model, slots=True, replay=self.replay)
            decoder = self.decoders[B] = engine.Decoder(model, self.cache, choice)
        return decoder.step(fed)

    def _retire_cancelled(self) -> None:
        for b in reversed(range(len(self.active))):
            if self.active[b].job.cancelled.is_set():
                self.dropped += 1
                self._free(b)

    def _free(self, b: int) -> None:
        last = len(self.active) - 1
        if b != last:
            self.cache.move(last, b)
            self.rows.move(last, b)
            self.active[b] = self.active[last]
        self.active.pop()

    # -- one token of each sequence -------------------------------------------------------
    def _sample(self, seqs: list[_Seq], logits: Tensor, start: int = 0) -> list[bool]:
        """Draw the next token of each sequence, row b of ``logits`` [B, V] for ``seqs[b]``
        (in slot start + b), in one pass over the batch; emit what is final; True for each
        sequence that has finished."""
        with one_thread():  # (a team's join would wait for the core the prompts hold)
            last = mask_padded(logits, self.n_valid)  # [B, V]
            picked, ok = self.rows.sample(last, start)
            ids = [t if f else -1 for t, f in zip(picked.tolist(), ok.tolist())]  # -1: none
        return [self._take(s, t if t >= 0 else None, last[b])
                for b, (s, t) in enumerate(zip(seqs, ids))]  # fmt: skip

    def _take(self, seq: _Seq, nxt: int | None, last: Tensor) -> bool:
        """``nxt`` (None: no finite logit) drawn from ``last`` [V] for ``seq``: True when done."""
        job = seq.job
        if job.cancelled.is_set():
            self.dropped += 1
            return True
        if nxt is None:  # this sequence ends, the others go on
            self._emit(job, "error", NO_FINITE)
            return True
        seq.made += 1
        seq.pending = nxt
        info = _logprobs(last, nxt, job.logprobs) if job.logprobs is not None else None
        if nxt in job.stop_ids:
            self._release(seq, seq.matcher.flush() if seq.matcher else [])
            self._emit(job, "done", "stop")
            return True
        seq.infos.append((nxt, info))
        if seq.matcher is not None:
            out, stopped = seq.matcher.push(nxt)
            self._release(seq, out)
            if stopped:
                self._emit(job, "done", "stop")
                return True
        else:
            self._release(seq, [nxt])
        seq.history.append(nxt)
        if seq.made >= job.max_tokens:
            self._release(seq, seq.matcher.flush() if seq.matcher else [])
            self._emit(job, "done", "length")
            return True
        return False

    def _release(self, seq: _Seq, ids: list[int]) -> None:
        for t in ids:
            info = None
            if seq.infos and seq.infos[0][0] == t:
                info = seq.infos.pop(0)[1]
            self._emit(seq.job, "token", (t, info))


def os_thread_name(name: str) -> None:
    """Name this thread for the OS (Linux: ``/proc/PID/task/TID/comm``, which top and
    ``bench/serve.py`` read to tell the scheduler's CPU time from the event loop's)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])


def _logprobs(logits: Tensor, chosen: int, k: int) -> dict[str, Any]:
    """log softmax of the model's logits: the chosen token's and the top k (id, logprob)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    out: dict[str, Any] = {"logprob": float(logp[chosen]), "top": []}
    if k > 0:
        values, ids = torch.topk(logp, min(k, logp.shape[-1]))
        out["top"] = list(zip(ids.tolist(), values.tolist()))
    return out
