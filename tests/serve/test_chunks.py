"""Streamed chunks are written from a head encoded once per request: their text must be what
the json module gives for the whole chunk object, for any text and model name."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from glassgpt.serve.api import chunk_head, delta_chunk, text_chunk

finishes = st.sampled_from([None, "stop", "length"])


def meta(name: str, created: int) -> dict[str, object]:
    return {"id": "cmpl-0123abcd", "object": "text_completion", "created": created,
            "model": name}  # fmt: skip


@given(name=st.text(), created=st.integers(0, 2**40), index=st.integers(0, 10**4),
       text=st.text(), finish=finishes)  # fmt: skip
def test_text_chunk_is_the_json_of_the_chunk(
    name: str, created: int, index: int, text: str, finish: str | None
) -> None:
    m = meta(name, created)
    want = {**m, "choices": [{"index": index, "text": text, "logprobs": None,
                              "finish_reason": finish}]}  # fmt: skip
    got = text_chunk(chunk_head(m), index, text, finish)
    assert got == json.dumps(want, ensure_ascii=False)
    assert json.loads(got) == want


@given(name=st.text(), index=st.integers(0, 10**4), content=st.text(), finish=finishes,
       role=st.booleans())  # fmt: skip
def test_delta_chunk_is_the_json_of_the_chunk(
    name: str, index: int, content: str, finish: str | None, role: bool
) -> None:
    m = {**meta(name, 1), "object": "chat.completion.chunk"}
    delta = {"role": "assistant", "content": content} if role else {"content": content}
    want = {**m, "choices": [{"index": index, "delta": delta, "logprobs": None,
                              "finish_reason": finish}]}  # fmt: skip
    got = delta_chunk(chunk_head(m), index, delta, finish)
    assert got == json.dumps(want, ensure_ascii=False)
