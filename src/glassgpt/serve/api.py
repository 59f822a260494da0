"""The OpenAI-compatible endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

Responses have the shapes of the OpenAI API reference, so the official ``openai`` client
works with ``base_url``. ``stream: true`` sends server-sent events, one JSON chunk per
``data:`` line, ending with ``data: [DONE]``. ``usage`` counts the prompt's tokens and the
tokens each choice returned. ``finish_reason`` is ``stop`` (a stop string, the chat
template's next turn, ``<|endoftext|>`` or the model's end-of-turn id, never sent) or
``length`` (``max_tokens``, or the context full).

A completion's prompt is encoded as the model was trained to see one (``encode_prompt``: BOS
first for Llama and Gemma). A chat's messages are rendered by the server's chat template
(:mod:`glassgpt.tokenizer.chat`): the model's own, whose text is encoded without adding
specials (the template writes BOS itself), as ``apply_chat_template(tokenize=True)`` does;
or glassgpt's plain ``role: content`` lines (``--chat-template plain``), encoded as a prompt
and stopped at the next turn; a server without one answers 400.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import torch
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from glassgpt.errors import GlassError
from glassgpt.sample.filters import SamplingConfig
from glassgpt.serve.errors import APIError
from glassgpt.serve.runs import Choice, Run, Settings
from glassgpt.serve.schemas import (
    CHAT_STOPS,
    ChatRequest,
    CompletionRequest,
    RequestBase,
    chat_prompt,
)
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.chat import PLAIN


def make_router(state: ServeState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [state.model_card()]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        state.check_model(model_id)
        return state.model_card()

    @router.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        state.check_model(body.model)
        prompts, texts = _prompts(state, body.prompt)
        run = Run(state.scheduler, state.tokenizer, prompts, _settings(state, body, body.logprobs))
        meta = _meta("cmpl", "text_completion", state)
        echo = texts if body.echo else None
        if body.stream:
            chunks = _completion_chunks(state, run, meta, echo, body.include_usage)
            return _sse(chunks, run)
        choices = await run.finish(request)
        return await _completion_body(state, meta, choices, echo, body.logprobs)

    @router.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Any:
        state.check_model(body.model)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        prompts, stops = _chat_prompts(state, body)
        k = (body.top_logprobs or 0) if body.logprobs else None
        run = Run(
            state.scheduler, state.tokenizer, prompts, _settings(state, body, k, stops), reply=True
        )
        meta = _meta("chatcmpl", "chat.completion", state)
        if body.stream:
            return _sse(_chat_chunks(state, run, meta, body.include_usage), run)
        choices = await run.finish(request)
        _raise_errors(choices)
        out = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": "".join(c.text)},
                "logprobs": {"content": _chat_logprobs(state, c)} if k is not None else None,
                "finish_reason": c.finish,
            }
            for c in choices
        ]
        return {**meta, "choices": out, "usage": _usage(choices)}

    return router


# -- requests -----------------------------------------------------------------------------
def _chat_prompts(state: ServeState, body: ChatRequest) -> tuple[list[list[int]], tuple[str, ...]]:
    """The chat's prompt ids by the server's template, and the stop strings it adds."""
    if state.chat is None:
        raise APIError(400, "this model has no chat template (no chat_template in its "
                       "tokenizer_config.json, no chat_template.jinja); start the server with "
                       "--chat-template FILE, or --chat-template plain for 'role: content' "
                       "lines", param="messages", code="no_chat_template")  # fmt: skip
    if state.chat is PLAIN:
        return _prompts(state, chat_prompt(body.messages), param="messages")[0], CHAT_STOPS
    try:
        text = state.chat.render([m.model_dump() for m in body.messages])
    except GlassError as e:  # the template's raise_exception: e.g. roles that do not alternate
        raise APIError(400, str(e), param="messages", code="invalid_messages") from None
    return _prompts(state, text, param="messages", add_specials=False)[0], ()


def _prompts(
    state: ServeState, prompt: Any, param: str = "prompt", add_specials: bool = True
) -> tuple[list[list[int]], list[str]]:
    """(ids of each prompt, its text); raises a 400 for ids out of range or too many tokens,
    naming ``param``, the request's field that holds the prompt (a chat's is ``messages``).
    A text is encoded by ``encode_prompt`` (the BOS a family's tokenizer adds), or, with
    ``add_specials=False``, as it is (special strings as their ids)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt) or [""]
    out, texts = [], []
    for item in items:
        if isinstance(item, str):
            try:  # e.g. a character outside a char model's vocabulary: the client's to fix
                ids = (
                    state.tokenizer.encode_prompt(item)
                    if add_specials
                    else state.tokenizer.encode(item, allowed_special="all")
                )
            except GlassError as e:
                raise APIError(400, str(e), param=param, code="invalid_prompt") from None
        else:
            ids = list(item)
            bad = [t for t in ids if not 0 <= t < state.n_valid]
            if bad:
                raise APIError(400, f"token id {bad[0]} is out of range [0, {state.n_valid})",
                               param="prompt", code="invalid_token_id")  # fmt: skip
        texts.append(item if isinstance(item, str) else state.text(ids))
        ids = ids or [state.start_id]
        if len(ids) > state.n_ctx:
            raise APIError(400, f"the prompt is {len(ids)} tokens, longer than the model's "
                           f"context of {state.n_ctx}", param=param,
                           code="context_length_exceeded")  # fmt: skip
        out.append(ids)
    return out, texts


def _settings(
    state: ServeState, body: RequestBase, logprobs: int | None, extra_stops: tuple[str, ...] = ()
) -> Settings:
    """The request's settings; a logit_bias id past the vocabulary is a 400 (this request's
    alone: the scheduler samples each row with its own settings)."""
    bias = {int(k): v for k, v in (body.logit_bias or {}).items()}
    bad = [i for i in bias if i >= state.n_valid]
    if bad:
        raise APIError(400, f"logit_bias: token id {bad[0]} is out of range [0, {state.n_valid})",
                       param="logit_bias", code="invalid_value")  # fmt: skip
    sampling = SamplingConfig(
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p if body.top_p < 1.0 else None,
        min_p=body.min_p or None,
        repetition_penalty=body.repetition_penalty,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        logit_bias=bias,
    )
    stops = tuple(body.stop or ()) + extra_stops  # type: ignore[arg-type]
    return Settings(sampling, body.max_tokens, body.n, body.seed, stops, logprobs)


def _meta(prefix: str, kind: str, state: ServeState) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind,
            "created": int(time.time()), "model": state.name}  # fmt: skip


def _usage(choices: list[Choice]) -> dict[str, int]:
    prompt = sum(len(c.prompt) for c in {id(c.prompt): c for c in choices}.values())
    made = sum(len(c.ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}


def _raise_errors(choices: list[Choice]) -> None:
    for c in choices:
        if c.error is not None:
            raise APIError(500, f"generation failed: {c.error}", type="server_error")


# -- completions --------------------------------------------------------------------------
async def _completion_body(
    state: ServeState,
    meta: dict[str, Any],
    choices: list[Choice],
    echo: list[str] | None,
    logprobs: int | None,
) -> dict[str, Any]:
    _raise_errors(choices)
    n = len(choices) // max(1, len(echo or [1]))
    out = []
    for c in choices:
        text = "".join(c.text)
        lp = None
        if logprobs is not None:
            ids, infos = list(c.ids), list(c.infos)
            if echo is not None:
                ids, infos = (
                    c.prompt + ids,
                    await _prompt_logprobs(state, c.prompt, logprobs) + infos,
                )
            lp = _completion_logprobs(state, ids, infos)
        if echo is not None:
            text = echo[c.index // n] + text
        out.append({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish})
    return {**meta, "choices": out, "usage": _usage(choices)}


async def _prompt_logprobs(state: ServeState, ids: list[int], k: int) -> list[Any]:
    """The logprob infos of a prompt's tokens (echo with logprobs): one full forward."""

    def compute() -> list[Any]:
        tokens = torch.tensor([ids], device=state.scheduler.device)
        with state.scheduler.lock, torch.inference_mode(), state.scheduler.steered():
            logp = torch.log_softmax(state.model(tokens)[0].float(), dim=-1)  # [T, V]
        infos: list[Any] = [None]
        for t in range(1, len(ids)):
            values, top = torch.topk(logp[t - 1], k) if k else (torch.zeros(0), torch.zeros(0))
            top_pairs = list(zip(top.tolist(), values.tolist()))
            infos.append({"logprob": float(logp[t - 1, ids[t]]), "top": top_pairs})
        return infos

    return await anyio.to_thread.run_sync(compute)


def _completion_logprobs(state: ServeState, ids: list[int], infos: list[Any]) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object (null where a token has none)."""
    tokens = [state.text([t]) for t in ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [None if i is None else i["logprob"] for i in infos],
        "top_logprobs": [
            None if i is None else {state.text([t]): lp for t, lp in i["top"]} for i in infos
        ],
        "text_offset": offsets,
    }


# -- streaming ----------------------------------------------------------------------------
# A stream sends one chunk per token, so its JSON is written from a head encoded once per
# request; the text is what json.dumps(chunk, ensure_ascii=False) gives for the whole chunk.
_encode = json.JSONEncoder(ensure_ascii=False).encode


def chunk_head(meta: dict[str, Any]) -> str:
    """A chunk's JSON up to its choices: ``{"id": …, "model": …, "choices": [``."""
    return _encode(meta)[:-1] + ', "choices": ['


def text_chunk(head: str, index: int, text: str, finish: str | None) -> str:
    """The JSON of a completion chunk (one choice, no logprobs)."""
    return (f'{head}{{"index": {index}, "text": {_encode(text)}, "logprobs": null, '
            f'"finish_reason": {_encode(finish)}}}]}}')  # fmt: skip


def delta_chunk(head: str, index: int, delta: dict[str, Any], finish: str | None) -> str:
    """The JSON of a chat completion chunk (one choice, no logprobs)."""
    return (f'{head}{{"index": {index}, "delta": {_encode(delta)}, "logprobs": null, '
            f'"finish_reason": {_encode(finish)}}}]}}')  # fmt: skip


def _error_chunk(message: str | None) -> str:
    return _encode({"error": {"message": message, "type": "server_error", "param": None,
                              "code": None}})  # fmt: skip


async def _completion_chunks(
    state: ServeState,
    run: Run,
    meta: dict[str, Any],
    echo: list[str] | None,
    usage: bool,
) -> AsyncIterator[str]:
    head = chunk_head(meta)
    n = len(run.choices) // max(1, len(echo or [1]))
    if echo is not None:
        for c in run.choices:
            yield text_chunk(head, c.index, echo[c.index // n], None)
    async for c, kind, piece in run.events():
        if kind == "error":
            yield _error_chunk(c.error)
        elif kind == "done" or piece:
            yield text_chunk(head, c.index, piece, c.finish if kind == "done" else None)
    if usage:
        yield _encode({**meta, "choices": [], "usage": _usage(run.choices)})


# -- chat ---------------------------------------------------------------------------------
def _chat_logprobs(state: ServeState, c: Choice) -> list[dict[str, Any]]:
    def entry(t: int, lp: float) -> dict[str, Any]:
        raw = state.tokenizer.decode_bytes([t])
        return {"token": state.text([t]), "logprob": lp, "bytes": list(raw)}

    out = []
    for t, info in zip(c.ids, c.infos):
        if info is None:
            continue
        top = [entry(a, lp) for a, lp in info["top"]]
        out.append({**entry(t, info["logprob"]), "top_logprobs": top})
    return out


async def _chat_chunks(
    state: ServeState, run: Run, meta: dict[str, Any], usage: bool
) -> AsyncIterator[str]:
    meta = {**meta, "object": "chat.completion.chunk"}
    head = chunk_head(meta)
    for c in run.choices:
        yield delta_chunk(head, c.index, {"role": "assistant", "content": ""}, None)
    async for c, kind, piece in run.events():
        if kind == "error":
            yield _error_chunk(c.error)
        elif kind == "done":
            if piece:
                yield delta_chunk(head, c.index, {"content": piece}, None)
            yield delta_chunk(head, c.index, {}, c.finish)
        elif piece:
            yield delta_chunk(head, c.index, {"content": piece}, None)
    if usage:
        yield _encode({**meta, "choices": [], "usage": _usage(run.choices)})


def _sse(chunks: AsyncIterator[str], run: Run) -> StreamingResponse:
    """Server-sent events; however the stream ends (done, disconnect, error), ``run`` stops.

    Events that are ready together (a client that reads slower than the model writes, a
    token and its ``done``, the last chunk and ``[DONE]``) go out in one write."""

    async def lines() -> AsyncIterator[bytes]:
        parts: list[bytes] = []
        try:
            async for c in chunks:
                parts.append(f"data: {c}\n\n".encode())
                if not run.ready:
                    yield b"".join(parts)
                    parts.clear()
            parts.append(b"data: [DONE]\n\n")
            yield b"".join(parts)
        finally:
            run.cancel()
            await chunks.aclose()  # type: ignore[attr-defined]

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)
