"""Any text a client sends gets a completion or a 4xx naming the prompt, never a 5xx.

A character model knows only its characters: the server must say which character it does
not know (a 400, which the ``openai`` client does not retry), not fail with a 500.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.serve.conftest import CHARS, Server, request

KNOWN = st.sampled_from(CHARS)
TEXT = st.text(st.one_of(KNOWN, st.characters(codec="utf-8")), max_size=40)


def check(status: int, body: object) -> None:
    assert status < 500, body
    if status == 200:
        assert isinstance(body, dict) and body["choices"], body
    else:
        assert 400 <= status < 500 and isinstance(body, dict), body
        message = body["error"]["message"]
        assert "\n" not in message and "internal error" not in message, message


def test_a_character_outside_the_vocabulary_is_a_400(live: Server) -> None:
    for path, body, param in (
        ("/v1/completions", {"model": "tiny", "prompt": "Café", "max_tokens": 2}, "prompt"),
        ("/v1/chat/completions",
         {"model": "tiny", "messages": [{"role": "user", "content": "Café"}], "max_tokens": 2},
         "messages"),
    ):  # fmt: skip
        status, out = request(live.url, path, body)
        assert status == 400, out
        assert out["error"]["param"] == param
        assert "character 'é' (U+00E9) at position" in out["error"]["message"]


@settings(max_examples=40)
@given(prompt=TEXT, chat=st.booleans(), stream=st.booleans())
def test_random_unicode_prompts_never_get_a_5xx(
    live: Server, prompt: str, chat: bool, stream: bool
) -> None:
    if chat:
        body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}]}
        path = "/v1/chat/completions"
    else:
        body, path = {"model": "tiny", "prompt": prompt}, "/v1/completions"
    status, out = request(live.url, path, {**body, "max_tokens": 2, "stream": stream})
    if stream and status == 200:
        assert isinstance(out, str) and "data: [DONE]" in out and "server_error" not in out
    else:
        check(status, out)


def test_a_seed_past_64_bits_is_a_400(live: Server) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "seed": 10**22}
    status, out = request(live.url, "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == "seed", out
