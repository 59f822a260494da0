"""Bad requests get the OpenAI error shape and the right status; the server keeps answering."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.serve.conftest import KEY, Server, request, start_server

GOOD = {"model": "tiny", "prompt": "hi", "max_tokens": 3}

CASES = [
    # (path, body, status, param)
    ("/v1/completions", "{", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", {**GOOD, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "prompt": [1, "a"]}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "temperature": -0.1}, 400, "temperature"),
    ("/v1/completions", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {**GOOD, "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {**GOOD, "top_k": 0}, 400, "top_k"),
    ("/v1/completions", {**GOOD, "n": 0}, 400, "n"),
    ("/v1/completions", {**GOOD, "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {**GOOD, "prompt": "a" * 65}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "prompt": [999]}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "prompt": [-1]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("/v1/completions", {**GOOD, "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "x", "content": "a"}]},
        400,
        "messages",
    ),
    (
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "a"}]},
        404,
        "model",
    ),
    ("/v1/nothing-here", {}, 404, None),
    ("/api/analyze", {"prompt": ""}, 400, "prompt"),
    ("/api/analyze", {"prompt": "hi", "pos": 9}, 400, "pos"),
    ("/api/circuits", {"prompt": "hi", "layer": 7, "head": 0}, 400, "head"),
    ("/api/logits", {"prompt": 3}, 400, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_request(live: Server, path: str, body: Any, status: int, param: str | None) -> None:
    got, out = request(live.url, path, body)
    assert got == status, out
    error = out["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    assert error["param"] == param
    assert request(live.url, "/v1/models", method="GET")[0] == 200


def test_wrong_method_is_json(live: Server) -> None:
    status, out = request(live.url, "/v1/completions", method="GET")
    assert status == 405 and "error" in out


@pytest.fixture(scope="module")
def keyed(live: Server) -> Iterator[str]:
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    model, tok = load(live.run)
    server, thread, url = start_server(create_app(model, tok, name="tiny", api_key=KEY, slots=2))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("header", [None, "Bearer wrong", KEY, f"Basic {KEY}"])
def test_api_key_required(keyed: str, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    for path, body in (("/v1/completions", GOOD), ("/api/analyze", {"prompt": "hi"})):
        status, out = request(keyed, path, body, headers=headers)
        assert status == 401, out
        assert out["error"]["code"] == "invalid_api_key"
    assert request(keyed, "/api/info", method="GET")[0] == 200  # the page reads it first


def test_api_key_accepted(keyed: str) -> None:
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0)
    assert c.completions.create(model="tiny", prompt="hi", max_tokens=2).choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed + "/v1", api_key="bad", max_retries=0).models.list()
