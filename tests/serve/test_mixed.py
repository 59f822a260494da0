"""A live server decoding requests of mixed settings in one batch, through the ``openai``
client: each stream equals the same request alone and ``glassgpt.sample.generate`` (the
oracle, a batch of one), with presence and repetition penalties, min-p and logit bias
among the settings; a request with a setting out of range gets a 400 naming it while the
others, queued beside it, finish with their own tokens."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tests.serve.conftest import decoded_together, held

from glassgpt.sample.generation import generate

openai = pytest.importorskip("openai", reason="the openai client is a dev dependency")

EXTENSIONS = ("top_k", "min_p", "repetition_penalty")  # not openai's keywords: in the body
MIX = [
    {"temperature": 0.0},
    {"temperature": 0.9, "presence_penalty": 1.5},
    {"temperature": 1.2, "top_p": 0.7, "min_p": 0.05},
    {"temperature": 0.0, "repetition_penalty": 1.8, "frequency_penalty": 0.3},
    {"temperature": 1.0, "top_k": 4, "logit_bias": {"5": 4.0, "7": -100}},
    {"temperature": 0.6, "min_p": 0.2, "presence_penalty": -0.5},
    {"temperature": 1.5, "top_k": 30, "top_p": 0.9, "repetition_penalty": 1.2},
    {"temperature": 0.0, "logit_bias": {"9": 6.0}},
]


def client(live: Any) -> Any:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=60)


def body(kw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kw.items() if k not in EXTENSIONS}
    out["extra_body"] = {k: kw[k] for k in EXTENSIONS if k in kw}
    return out


def expected(oracle: Any, prompt: str, max_tokens: int, seed: int, kw: dict[str, Any]) -> str:
    model, tok = oracle
    opts = dict(kw)
    if "logit_bias" in opts:
        opts["logit_bias"] = {int(k): float(v) for k, v in opts["logit_bias"].items()}
    eos = tok.special_tokens["<|endoftext|>"]
    ids = generate(model, tok.encode(prompt), tokenizer=tok, max_new_tokens=max_tokens,
                   seed=seed, stop_ids=(eos,), **opts)  # fmt: skip
    return tok.decode(ids)


def stream_text(live: Any, prompt: str, m: int, seed: int, kw: dict[str, Any]) -> str:
    s = client(live).completions.create(model="tiny", prompt=prompt, max_tokens=m, seed=seed,
                                        stream=True, **body(kw))  # fmt: skip
    return "".join(c.choices[0].text for c in s if c.choices)


PROMPTS = ["A", "The cat", "Hello there, friend", "x", "To be", "Q:", "one two three", "z"]


def test_a_batch_of_mixed_settings_gives_each_request_its_tokens_alone(
    live: Any, oracle: Any
) -> None:
    jobs = [(PROMPTS[i], 15 + 2 * i, 300 + i, MIX[i]) for i in range(8)]
    alone = [stream_text(live, *job) for job in jobs]

    def run(i: int, out: dict[int, str]) -> None:
        out[i] = stream_text(live, *jobs[i])

    together = decoded_together(live, run, 8)
    assert [together[i] for i in range(8)] == alone
    assert alone == [expected(oracle, *job) for job in jobs]
    # the settings act: the -100 bias bans its token, a +6 bias on a greedy row makes it win
    tok = oracle[1]
    assert tok.decode([7]) not in alone[4]
    assert set(alone[7]) == {tok.decode([9])}


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": {"100000": 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": 101.0}}, "logit_bias"),
        ({"logit_bias": {"a": 1.0}}, "logit_bias"),
    ],
)
def test_a_setting_out_of_range_fails_only_its_request(
    live: Any, oracle: Any, bad: dict[str, Any], param: str
) -> None:
    jobs = [(PROMPTS[i], 12, 500 + i, MIX[i]) for i in range(4)]
    got: dict[int, Any] = {}

    def run(i: int) -> None:
        if i == len(jobs):
            try:
                stream_text(live, "Q:", 12, 1, {"temperature": 0.8, **bad})
                got[i] = "no error"
            except openai.BadRequestError as e:
                got[i] = e
            return
        got[i] = stream_text(live, *jobs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs) + 1)]
    held(live, len(jobs), lambda: [t.start() for t in threads])
    for t in threads:
        t.join(60)
    error = got[len(jobs)]
    assert isinstance(error, openai.BadRequestError), error
    assert error.status_code == 400
    assert error.body["param"] == param and param in error.body["message"]
    assert [got[i] for i in range(len(jobs))] == [expected(oracle, *job) for job in jobs]
