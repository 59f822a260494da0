"""Prompts encoded on the prompt thread while the scheduler steps other sequences
(``serve.admission``): each request still decodes what ``generate`` gives it alone, when
sequences end during the prompt's forward (its slots then move down, and a step of a batch
size not yet recorded waits for the prompt), and an analysis that holds the model's lock
stops both the steps and the prompts; through the ``openai`` client, streams that arrive
while another decodes equal their non-streamed completions."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from tests.serve.conftest import Collected

from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.generation import generate
from glassgpt.serve.scheduler import Job, Scheduler
from glassgpt.tokenizer import CharTokenizer

TOK = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,"))
NAMES = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
         "presence_penalty", "logit_bias")  # fmt: skip


def model_of() -> GPT:
    """A float32 model as ``serve`` holds it (products on glassgpt's kernels where built, so
    that the steps are replayed from their recordings)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=TOK.n_vocab, n_ctx=256, d_model=32, n_layers=2, n_heads=4))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return cast(model.eval(), "float32")


def want(model: GPT, job: Job) -> list[int]:
    opts = {k: getattr(job.sampling, k) for k in NAMES}
    return generate(model, job.prompt, max_new_tokens=job.max_tokens, seed=job.seed, **opts)


def test_prompts_encoded_beside_the_steps_decode_what_generate_does() -> None:
    model = model_of()
    sched = Scheduler(model, TOK, slots=4)
    got = Collected(5)
    settings = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.9, top_p=0.8),
                SamplingConfig(temperature=1.1, top_k=5), SamplingConfig(temperature=0.0,
                repetition_penalty=1.5), SamplingConfig(temperature=0.7, min_p=0.1)]  # fmt: skip
    texts = ["the cat sat", "a dog", "hello there", "on the mat, a", "zz"]
    jobs = [Job(TOK.encode(t), cfg, max_tokens=150 if i < 2 else 20, seed=i, emit=got.emit_to(i))
            for i, (t, cfg) in enumerate(zip(texts, settings))]  # fmt: skip
    sched.start()
    try:
        for job in jobs[:2]:
            sched.submit(job)
        deadline = time.monotonic() + 30
        while sched.busy < 2:  # both decode: the next prompts go to the prompt thread
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for job in jobs[2:]:
            sched.submit(job)
        got.wait()
    finally:
        sched.close()
    assert sched.overlapped >= 1
    assert got.outs == [want(model, job) for job in jobs]


def test_slots_move_down_when_a_sequence_ends_during_the_prompts_forward() -> None:
    model = model_of()
    sched = Scheduler(model, TOK, slots=6)
    sched._prompts = ThreadPoolExecutor(1)
    got = Collected(5)
    greedy, warm = SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8)
    jobs = [Job(TOK.encode(t), cfg, max_tokens=n, seed=i, emit=got.emit_to(i))
            for i, (t, cfg, n) in enumerate([("the cat", greedy, 12), ("a", warm, 12),
                                             ("one two", warm, 3), ("hello", greedy, 9),
                                             ("abc, def", warm, 9)])]  # fmt: skip
    try:
        sched._admit_all(jobs[:3])
        sched._step()  # (B = 3 recorded while no prompt is in flight)
        sched._launch(jobs[3:])  # into slots 3 and 4
        assert sched.flight is not None and sched.flight.start == 3
        assert sched._may_step_beside()
        sched._step()  # job 2's third token: it ends, and slot 2 is free
        assert sched.busy == 2
        assert not sched._may_step_beside()  # a step of 2 rows has not been recorded yet
        sched._land()  # jobs 3 and 4 move down into slots 2 and 3
        held = [s.job for s in sched.active]
        assert held[2:] == [jobs[3], jobs[4]] and {id(j) for j in held[:2]} == {
            id(jobs[0]),
            id(jobs[1]),
        }
        while sched.active:
            sched._step()
        got.wait(timeout=5)
    finally:
        sched._prompts.shutdown()
    assert got.outs == [want(model, job) for job in jobs]


def test_the_model_lock_holds_both_the_steps_and_the_prompts() -> None:
    model = model_of()
    sched = Scheduler(model, TOK, slots=4)
    got = Collected(2)
    first = Job(TOK.encode("the cat"), SamplingConfig(temperature=0.0), max_tokens=200, seed=0,
                emit=got.emit_to(0))  # fmt: skip
    second = Job(TOK.encode("a dog"), SamplingConfig(temperature=0.0), max_tokens=5, seed=1,
                 emit=got.emit_to(1))  # fmt: skip
    sched.start()
    try:
        sched.submit(first)
        deadline = time.monotonic() + 30
        while sched.steps < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        with sched.lock:  # as an analysis holds it
            sched.submit(second)
            steps, forwards = sched.steps, sched.prompt_forwards
            threading.Event().wait(0.2)
            assert (sched.steps, sched.prompt_forwards) in {(steps, forwards),
                                                            (steps + 1, forwards)}  # fmt: skip
        got.wait()
    finally:
        sched.close()
    assert got.outs == [want(model, first), want(model, second)]


def test_streams_that_arrive_while_another_decodes_equal_their_completions(live: Any) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is a dev dependency")
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=60)
    sched, before = live.scheduler, live.scheduler.overlapped
    long = iter(client.completions.create(model="tiny", prompt="The cat", max_tokens=400,
                                          seed=1, stream=True))  # fmt: skip
    next(long)  # its first token has come: it is decoding
    asks = [("Hello", 20, 5, {"temperature": 0.9}), ("To be", 15, 6, {"temperature": 0.0}),
            ("one two", 25, 7, {"temperature": 1.1, "top_p": 0.8})]  # fmt: skip
    streamed: dict[int, str] = {}

    def ask(i: int) -> None:
        prompt, m, seed, kw = asks[i]
        chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=m, seed=seed,
                                           stream=True, **kw)  # fmt: skip
        streamed[i] = "".join(c.choices[0].text for c in chunks if c.choices)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(1 for c in long if c.choices) > 0  # (the long one was still decoding)
    assert sched.overlapped > before
    for i, (prompt, m, seed, kw) in enumerate(asks):
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=m, seed=seed,
                                          **kw)  # fmt: skip
        assert streamed[i] == whole.choices[0].text
