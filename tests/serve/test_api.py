"""The OpenAI-compatible API through the official ``openai`` client, against a live server.

The oracle is ``glassgpt.sample.generate`` on the same checkpoint loaded separately: every
completion must be its tokens, for the same prompt, settings and seed.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch
from tests.serve.conftest import decoded_together

from glassgpt.sample.generation import generate
from glassgpt.serve.schemas import CHAT_STOPS

openai = pytest.importorskip("openai", reason="the openai client is a dev dependency")

SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 0.8},
    {"temperature": 1.0, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
    {"temperature": 1.0, "frequency_penalty": 0.5},
]


def client(live: Any, key: str = "none") -> Any:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=60)


def expected(oracle: Any, prompt: str, max_tokens: int, seed: int, **kw: Any) -> list[int]:
    model, tok = oracle
    opts = {k: v for k, v in kw.items() if k != "stop"}
    if "top_p" in opts and opts["top_p"] >= 1.0:
        opts.pop("top_p")
    eos = tok.special_tokens["<|endoftext|>"]
    ids = tok.encode(prompt, allowed_special="all")
    return generate(model, ids, tokenizer=tok, max_new_tokens=max_tokens, seed=seed,
                    stop_ids=(eos,), stop=tuple(kw.get("stop", ())), **opts)  # fmt: skip


def extra(kw: dict[str, Any]) -> dict[str, Any]:
    """openai's keywords, with top_k (an extension) in the body."""
    out = {k: v for k, v in kw.items() if k != "top_k"}
    if "top_k" in kw:
        out["extra_body"] = {"top_k": kw["top_k"]}
    return out


def test_models(live: Any) -> None:
    models = client(live).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client(live).models.retrieve("tiny").id == "tiny"


@pytest.mark.parametrize("kw", SETTINGS)
def test_completion_equals_generate(live: Any, oracle: Any, kw: dict[str, Any]) -> None:
    prompt, seed = "To be, or not", 7
    r = client(live).completions.create(model="tiny", prompt=prompt, max_tokens=24, seed=seed,
                                        **extra(kw))  # fmt: skip
    want = expected(oracle, prompt, 24, seed, **kw)
    tok = oracle[1]
    assert r.choices[0].text == tok.decode(want)
    assert r.usage.prompt_tokens == len(tok.encode(prompt))
    assert r.usage.completion_tokens == len(want)
    assert r.usage.total_tokens == r.usage.prompt_tokens + len(want)
    assert r.choices[0].finish_reason == ("length" if len(want) == 24 else "stop")


def test_past_the_context_the_window_slides_as_in_generate(live: Any, oracle: Any) -> None:
    import warnings

    prompt = "Longer than the context:"  # 24 tokens; n_ctx = 64
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        runs = ((s, expected(oracle, prompt, 100, s, temperature=0.9)) for s in range(40))
        seed, want = next((s, w) for s, w in runs if len(w) > 64 - 24 + 8)  # no early <|eot|>
    assert any("sliding the window" in str(w.message) for w in seen)
    r = client(live).completions.create(model="tiny", prompt=prompt, max_tokens=100, seed=seed,
                                        temperature=0.9)  # fmt: skip
    assert r.choices[0].text == oracle[1].decode(want)


def test_streaming_completion_equals_whole(live: Any, oracle: Any) -> None:
    kw = {"model": "tiny", "prompt": "Once upon", "max_tokens": 30, "seed": 3, "temperature": 0.9}
    whole = client(live).completions.create(**kw)
    chunks = list(client(live).completions.create(**kw, stream=True,
                                                  stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text == oracle[1].decode(expected(oracle, "Once upon", 30, 3,
                                                                      temperature=0.9))  # fmt: skip
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_ids_prompt_and_echo(live: Any, oracle: Any) -> None:
    tok = oracle[1]
    ids = tok.encode("abc abc")
    r = client(live).completions.create(model="tiny", prompt=ids, max_tokens=10, seed=1, echo=True)
    want = expected(oracle, "abc abc", 10, 1)
    assert r.choices[0].text == "abc abc" + tok.decode(want)


def test_stop_strings(live: Any, oracle: Any) -> None:
    tok = oracle[1]
    for seed in range(4):
        r = client(live).completions.create(model="tiny", prompt="The", max_tokens=40, seed=seed,
                                            stop=["e", "a"])  # fmt: skip
        want = tok.decode(expected(oracle, "The", 40, seed, stop=["e", "a"]))
        assert r.choices[0].text == want
        assert "e" not in want and "a" not in want


def test_n_choices_use_consecutive_seeds(live: Any, oracle: Any) -> None:
    r = client(live).completions.create(model="tiny", prompt="Hi", max_tokens=12, n=3, seed=10)
    tok = oracle[1]
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.text == tok.decode(expected(oracle, "Hi", 12, 10 + c.index))
    assert r.usage.prompt_tokens == 2
    assert r.usage.completion_tokens == sum(len(tok.encode(c.text)) for c in r.choices)


def test_seed_determinism(live: Any) -> None:
    kw = {"model": "tiny", "prompt": "Seeds", "max_tokens": 30, "temperature": 1.0}
    texts = [client(live).completions.create(**kw, seed=s).choices[0].text for s in (5, 5, 6)]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_logprobs_are_the_models(live: Any, oracle: Any) -> None:
    model, tok = oracle
    r = client(live).completions.create(model="tiny", prompt="Log", max_tokens=8, seed=2,
                                        logprobs=3)  # fmt: skip
    lp = r.choices[0].logprobs
    ids = tok.encode("Log") + tok.encode(r.choices[0].text)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)  # [T, V]
    for i, got in enumerate(lp.token_logprobs):
        t = len(tok.encode("Log")) + i
        assert math.isclose(got, float(ref[t - 1, ids[t]]), abs_tol=1e-4)
        best = max(lp.top_logprobs[i].values())
        assert math.isclose(best, float(ref[t - 1].max()), abs_tol=1e-4)


def test_chat(live: Any, oracle: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    c = client(live)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, seed=4)
    prompt = "system: Be brief.\nuser: Hi\nassistant:"
    want = oracle[1].decode(expected(oracle, prompt, 20, 4, stop=list(CHAT_STOPS)))
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    stream = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, seed=4,
                                       stream=True)  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_batched_streams_equal_alone(live: Any, oracle: Any) -> None:
    prompts = ["A", "The cat", "Hello there, friend", "x", "To be", "Q:", "one two three", "z"]
    jobs = [
        (prompts[i], {**SETTINGS[i % len(SETTINGS)], "seed": 100 + i}, 20 + 3 * i) for i in range(8)
    ]

    def run(i: int, out: dict[int, str]) -> None:
        prompt, kw, m = jobs[i]
        stream = client(live).completions.create(model="tiny", prompt=prompt, max_tokens=m,
                                                 stream=True, **extra(kw))  # fmt: skip
        out[i] = "".join(c.choices[0].text for c in stream if c.choices)

    alone: dict[int, str] = {}
    for i in range(8):
        run(i, alone)
    together = decoded_together(live, run, 8)
    assert together == alone
    tok = oracle[1]
    for i, (prompt, kw, m) in enumerate(jobs):
        seed = kw.pop("seed")
        assert alone[i] == tok.decode(expected(oracle, prompt, m, seed, **kw))


def test_disconnect_stops_generation(live: Any) -> None:
    import http.client
    import json
    from urllib.parse import urlsplit

    sched = live.scheduler
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "stream": True,
            "max_tokens": 50}  # fmt: skip
    parts = urlsplit(live.url)
    steps, dropped = sched.steps, sched.dropped
    with sched.lock:  # the job waits for its prefill while the client goes away
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200
        assert b"assistant" in resp.readline()  # the role chunk arrives before any token
        deadline = time.monotonic() + 30
        while sched.admitting is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        job = sched.admitting
        conn.sock.shutdown(2)
        conn.close()
        while not job.cancelled.is_set():
            assert time.monotonic() < deadline, "the server did not notice the disconnect"
            time.sleep(0.01)
    while sched.busy or sched.admitting is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sched.dropped == dropped + 1
    assert sched.steps == steps  # no decoding step ran for it


@pytest.mark.parametrize("content", ["a" * 70, "Café"])
def test_a_chat_that_does_not_fit_names_messages(live: Any, content: str) -> None:
    """A chat has no ``prompt`` field: a too-long one (or one with a character the model does
    not know) is a 400 naming ``messages``, the field the client sent."""
    messages = [{"role": "user", "content": content}]
    with pytest.raises(openai.BadRequestError) as e:
        client(live).chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert e.value.param == "messages" and e.value.status_code == 400
    assert e.value.code == ("context_length_exceeded" if len(content) > 64 else "invalid_prompt")
