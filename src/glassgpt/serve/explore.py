"""The explorer's JSON endpoints, each a thin view of a ``glassgpt.inspect`` function.

    POST /api/analyze      tokens, every head's pattern, the logit lens, the last logits
    POST /api/logits       the raw logits z at one position (the page applies T, k, p itself)
    POST /api/attribution  direct logit attribution of one token at one position
    POST /api/circuits     the top QK and OV token pairs of one head
    GET  /api/info         the model's shape and its head scores
    GET  /api/checkpoints  the steps of the run's kept checkpoints (the checkpoint slider)
    GET  /api/vocab        the text of every token id
    POST /api/patch, /api/patch/effect, /api/ablate, GET /api/patch/example
                           see ``glassgpt.serve.interventions``

Patterns travel as bytes (round(255 · p), base64), logits as float32 (base64): a 64-token
prompt on GPT-2 small is 590k pattern values. A request with ``step`` is answered by the run's
checkpoint of that step (``glassgpt.serve.checkpoints``) instead of the served model, and says
so (``step`` in every answer, which the page's panels show); analyze then carries that model's
head scores. The last prompts' analyses are kept, so moving
between positions, tokens and heads recomputes nothing. Every forward holds the scheduler's
lock (hooks are attached per model, so two forwards must not overlap).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictInt

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import evaluating, run_with_cache
from glassgpt.inspect.circuits import ov_circuit, qk_circuit, shown_distance
from glassgpt.inspect.heads import head_scores
from glassgpt.inspect.lens import direct_logit_attribution, unembed
from glassgpt.inspect.report import encode_prompt
from glassgpt.serve.checkpoints import Checkpoints
from glassgpt.serve.errors import APIError
from glassgpt.serve.interventions import Interventions, b64
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.display import token_texts

KEEP = 8  # analyses kept (by prompt)
BARS = 24  # attribution bars shown; the rest are summed into one


class Ask(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    pos: StrictInt | None = None
    token: StrictInt | None = None
    layer: StrictInt = 0
    head: StrictInt = 0
    step: StrictInt | None = None  # a kept checkpoint's step (None: the served model)


def lens_top(model: Any, resid: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k (probabilities, ids) [L + 1, T, k] of the logit lens, from the residual
    stream [L + 1, T, d_model] at ``glassgpt.inspect.logit_lens``'s sites.

    The same unembedding as ``logit_lens`` (N_f, then W_U and b_U), one layer at a time, so
    the memory is T · n_vocab, not (L + 1) · T · n_vocab (1.3 GB for 500 tokens of GPT-2).
    """
    probs, ids = [], []
    for x in resid:
        z = unembed(model, x)  # [T, n_vocab]
        p, i = torch.softmax(z.float(), dim=-1).topk(k, dim=-1)
        probs.append(p)
        ids.append(i)
    return torch.stack(probs), torch.stack(ids)


class Explorer:
    """Analyses of prompts, computed once each (under the model lock)."""

    def __init__(self, state: ServeState) -> None:
        self.state = state
        self.model, self.tok = state.model, state.tokenizer
        self.lock = state.scheduler.lock
        self.cache: OrderedDict[tuple[str, int | None], dict[str, Any]] = OrderedDict()
        self.cache_lock = threading.Lock()
        self._scores: dict[str, Any] | None = None
        self._vocab: list[str] | None = None
        device = next(self.model.parameters()).device
        self.checkpoints = Checkpoints(state.source, device)
        self._step_scores: dict[int, dict[str, Any]] = {}

    def model_at(self, step: int | None) -> Any:
        """The served model, or the run's checkpoint of ``step``."""
        if step is None:
            return self.model
        try:
            return self.checkpoints.model(step)
        except GlassError as e:
            raise APIError(400, str(e), param="step") from None

    def _entry(self, prompt: str, step: int | None = None) -> dict[str, Any]:
        key = (prompt, step)
        with self.cache_lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        model = self.model_at(step)
        try:
            ids = encode_prompt(model, self.tok, prompt)
        except GlassError as e:
            raise APIError(400, str(e), param="prompt") from None
        L = model.config.n_layers
        names = ["blocks.0.resid_pre"] + [f"blocks.{layer}.resid_post" for layer in range(L)]
        with self.lock, evaluating(model), torch.no_grad():
            logits, acts = run_with_cache(model, ids, ["pattern", *names])
            resid = torch.stack([acts[n][0] for n in names])  # [L + 1, T, d_model]
            lens = lens_top(model, resid, 3)
        entry = {"ids": ids, "logits": logits[0].float(), "patterns": acts.stack("pattern"),
                 "lens": (names, *lens)}  # fmt: skip
        entry["step"] = step
        with self.cache_lock:
            self.cache[key] = entry
            while len(self.cache) > KEEP:
                self.cache.popitem(last=False)
        return entry

    def _pos(self, entry: dict[str, Any], pos: int | None) -> int:
        T = len(entry["ids"])
        p = T - 1 if pos is None else pos
        if not 0 <= p < T:
            raise APIError(400, f"pos {p} is outside the prompt's {T} tokens", param="pos")
        return p

    def analyze(self, ask: Ask) -> dict[str, Any]:
        e = self._entry(ask.prompt, ask.step)
        ids = e["ids"]
        texts = token_texts(self.tok, ids)
        pat = e["patterns"][:, 0].float()  # [L, H, T, T]
        names, probs, top = e["lens"]  # [L + 1, T, 3] each
        lens_rows = [
            {
                "name": name,
                "cells": [
                    {"top": token_texts(self.tok, top[r, t].tolist()),
                     "p": [round(x, 4) for x in probs[r, t].tolist()]}
                    for t in range(len(ids))
                ],
            }
            for r, name in enumerate(names)
        ]  # fmt: skip
        return {
            "tokens": [
                {"id": i, "text": s, "bytes": list(self.tok.decode_bytes([i]))}
                for i, s in zip(ids, texts)
            ],
            "patterns": b64((pat * 255).round().clamp(0, 255).to(torch.uint8)),
            "shape": list(pat.shape),
            "lens": lens_rows,
            **self.logits(ask, e),
            "step": ask.step,
            "head_scores": self.scores(ask.step),
        }

    def logits(self, ask: Ask, entry: dict[str, Any] | None = None) -> dict[str, Any]:
        e = entry or self._entry(ask.prompt, ask.step)
        p = self._pos(e, ask.pos)
        z = e["logits"][p, : self.state.n_valid].contiguous()
        return {"pos": p, "logits": b64(z.to(torch.float32)), "step": ask.step}

    def attribution(self, ask: Ask) -> dict[str, Any]:
        e = self._entry(ask.prompt, ask.step)
        p = self._pos(e, ask.pos)
        token = int(e["logits"][p].argmax()) if ask.token is None else ask.token
        if not 0 <= token < self.state.n_valid:
            raise APIError(400, f"token {token} is out of range", param="token")
        if "dla" not in e:
            try:
                with self.lock, torch.no_grad():
                    e["dla"] = direct_logit_attribution(self.model_at(ask.step), e["ids"])
            except GlassError as err:
                raise APIError(400, str(err)) from None
        dla = e["dla"]
        ids = torch.full((1, len(e["ids"])), token, dtype=torch.long)
        with torch.no_grad():
            parts = dla.logits(ids.to(dla.resid.device))[:, 0, p].float().cpu()  # [n_parts]
        names = list(dla.names)
        order = parts.abs().argsort(descending=True).tolist()
        shown = sorted(order[: BARS - 1]) if len(names) > BARS else list(range(len(names)))
        bars = [{"name": names[i], "value": float(parts[i])} for i in shown]
        rest = [i for i in range(len(names)) if i not in set(shown)]
        if rest:
            bars.append({"name": f"{len(rest)} other parts", "value": float(parts[rest].sum())})
        return {"pos": p, "token": token, "text": token_texts(self.tok, [token])[0],
                "bars": bars, "total": float(parts.sum()),
                "logit": float(e["logits"][p, token]), "step": ask.step}  # fmt: skip

    def circuits(self, ask: Ask) -> dict[str, Any]:
        cfg = self.model.config
        if not (0 <= ask.layer < cfg.n_layers and 0 <= ask.head < cfg.n_heads):
            raise APIError(400, f"no head L{ask.layer}H{ask.head} in a model of "
                           f"{cfg.n_layers} layers × {cfg.n_heads} heads", param="head")  # fmt: skip
        e = self._entry(ask.prompt, ask.step)
        uniq = list(dict.fromkeys(e["ids"]))[:40]
        out: dict[str, Any] = {"layer": ask.layer, "head": ask.head, "step": ask.step}
        model = self.model_at(ask.step)
        with self.lock, torch.no_grad():
            qk = qk_circuit(model, ask.layer, ask.head, distance=shown_distance(model))
            for name, m in (("qk", qk),
                            ("ov", ov_circuit(model, ask.layer, ask.head))):  # fmt: skip
                pairs = m.top_pairs(10, rows=uniq)
                a = token_texts(self.tok, [r for r, _, _ in pairs])
                b = token_texts(self.tok, [c for _, c, _ in pairs])
                out[name] = [[x, y, round(v, 4)] for x, y, (_, _, v) in zip(a, b, pairs)]
        return out

    def vocab(self) -> list[str]:
        """The text of every id (the page labels distributions with it)."""
        if self._vocab is None:
            self._vocab = token_texts(self.tok, range(self.state.n_valid))
        return self._vocab

    def scores(self, step: int | None) -> dict[str, Any]:
        """Head scores (as /api/info's) of the served model or of checkpoint ``step``."""
        if step is None:
            return self.info()["head_scores"]
        if step not in self._step_scores:
            model = self.model_at(step)
            with self.lock, torch.no_grad():
                s = head_scores(model, batch=4)
            self._step_scores[step] = {k: v.tolist() for k, v in s.as_dict().items()}
        return self._step_scores[step]

    def steps(self) -> dict[str, Any]:
        """The steps of the run's kept checkpoints, oldest first (the slider's stops)."""
        return {"steps": self.checkpoints.steps()}

    def info(self) -> dict[str, Any]:
        if self._scores is None:
            with self.lock, torch.no_grad():
                s = head_scores(self.model, batch=4)
                qk = qk_circuit(self.model, 0, 0, distance=shown_distance(self.model))
                qk.top_pairs(1, rows=[0])  # warm: the first costs ~1 s
            self._scores = {k: v.tolist() for k, v in s.as_dict().items()}
        cfg = self.model.config
        return {"model": self.state.name, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                "n_kv_heads": cfg.kv_heads, "n_ctx": cfg.n_ctx, "context": self.state.n_ctx, "n_vocab": self.state.n_valid, "d_model": cfg.d_model,
                "auth": self.state.api_key is not None, "head_scores": self._scores}  # fmt: skip


def _endpoint(fn: Any) -> Any:
    def endpoint(ask: Ask) -> dict[str, Any]:
        return fn(ask)  # a plain def: FastAPI runs it in its thread pool

    return endpoint


def make_router(state: ServeState, guard: list[Any]) -> APIRouter:
    """The /api routes; ``guard`` (the API-key check) protects all but /api/info."""
    explorer = Explorer(state)
    router = APIRouter(prefix="/api")
    router.add_api_route("/info", explorer.info, methods=["GET"])
    router.add_api_route("/vocab", explorer.vocab, methods=["GET"], dependencies=guard)
    router.add_api_route("/checkpoints", explorer.steps, methods=["GET"], dependencies=guard)
    for name in ("analyze", "logits", "attribution", "circuits"):
        fn = _endpoint(getattr(explorer, name))
        router.add_api_route(f"/{name}", fn, methods=["POST"], dependencies=guard)
    iv = Interventions(state, explorer.model_at)
    for path, fn in (("/patch", iv.patch), ("/patch/effect", iv.effect), ("/ablate", iv.ablate)):
        router.add_api_route(path, fn, methods=["POST"], dependencies=guard)
    router.add_api_route("/patch/example", iv.example, methods=["GET"], dependencies=guard)
    return router
