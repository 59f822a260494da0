"""The explorer's feature pages: an SAE's latents, searched, read on a prompt, and steered.

    GET  /api/features/info        the SAE (hook, arch, width; a CLT's layers) and its pages
    GET  /api/features/page/{i}    latent i's page: top contexts, histogram, density, logit effect
    POST /api/features/search      latents by id ("12", "#12"), by top token, by context text
    POST /api/features/tokens      f = SAE.encode(a_site(prompt)): each token's top latents
    POST /api/features/steer       the next-token distribution and a sample, steered by one
                                   latent (add: a + α W_dec[i]; clamp: a + (c − f_i(a)) W_dec[i])
                                   beside the unsteered ones

A CLT (``serve --sae CLT_DIR``) is served as one dictionary of L · d_sae features numbered as
its pages number them (feature i of layer l is l · d_sae + i; search takes "l/i"), its codes
read from every layer's MLP input, and steered by clamping it or adding to it
(:func:`glassgpt.features.clt_steering.edit_hooks`: every target layer's write changed).

Pages come from ``glassgpt sae features`` (``SAE_DIR/features.safetensors``); without them the
page and search endpoints say how to make them, and the others still work. Steering is
:func:`glassgpt.features.steering.feature_hooks`; a sample is ``glassgpt.sample.generate``
under those hooks with a fixed seed, so moving the slider changes only the steering. Every
forward holds the scheduler's lock.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

import torch
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from glassgpt.console import say
from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, clt_folder
from glassgpt.features.clt import CONFIG_FILE as CLT_FILE
from glassgpt.features.clt_pages import is_clt
from glassgpt.features.clt_steering import Edit, edit_hooks
from glassgpt.features.clt_train import check_clt, read_layers
from glassgpt.features.identity import sae_extra
from glassgpt.features.pages import FILE, load_pages
from glassgpt.features.sae import SAE, sae_folder
from glassgpt.features.sites import check_model, read
from glassgpt.features.steering import feature_hooks
from glassgpt.inspect.cache import evaluating
from glassgpt.inspect.report import encode_prompt
from glassgpt.sample import generate
from glassgpt.serve.errors import APIError
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.display import token_texts

TOP = 10  # tokens shown in a steered distribution


class Search(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    query: str
    limit: StrictInt = Field(30, ge=1, le=500)


class Tokens(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    top: StrictInt = Field(8, ge=1, le=64)
    feature: StrictInt | None = None


class SteerAsk(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    feature: StrictInt
    mode: Literal["add", "clamp"] = "add"
    value: StrictFloat | StrictInt = 0.0
    max_tokens: StrictInt = Field(32, ge=0, le=256)
    temperature: StrictFloat | StrictInt = Field(1.0, ge=0.0, le=5.0)
    seed: StrictInt = 0


class Features:
    """One SAE (or CLT) over the served model, and its pages (or None)."""

    def __init__(self, state: ServeState, sae: SAE | CLT, pages: Any = None) -> None:
        self.state, self.model, self.tok = state, state.model, state.tokenizer
        self.clt = isinstance(sae, CLT)
        if isinstance(sae, CLT):
            check_clt(sae, self.model)
            self.L, self.S = sae.cfg.n_layers, sae.cfg.d_sae
        else:
            self.site = check_model(sae, self.model)
            self.L, self.S = 1, sae.cfg.d_sae
        param = next(self.model.parameters())
        self.sae = sae.to(param.device).eval()
        self.pages = pages
        self.lock = state.scheduler.lock
        self._texts: list[str] | None = None
        self._index: tuple[list[list[str]], list[str]] | None = None

    # -- pages and search ------------------------------------------------------------------
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = token_texts(self.tok, range(self.model.config.n_vocab))
        return self._texts

    def _need_pages(self) -> Any:
        if self.pages is None:
            raise APIError(404, "this SAE has no feature pages: make them with glassgpt sae "
                           "features -c SAE_DIR --data …, then restart the server")  # fmt: skip
        return self.pages

    def name(self, i: int) -> str:
        """Feature ``i``'s name: "i", a CLT's "l/i"."""
        return f"{i // self.S}/{i % self.S}" if self.clt else str(i)

    def info(self) -> dict[str, Any]:
        p = self.pages
        if isinstance(self.sae, CLT):
            cfg = self.sae.cfg
            return {"sae": True, "clt": {"n_layers": cfg.n_layers, "d_sae": cfg.d_sae},
                    "hook": "blocks.*.mlp.in", "out_hook": "blocks.*.mlp_out", "arch": f"clt-{cfg.arch}",
                    "d_sae": self.L * self.S, "d_in": cfg.d_model, "k": cfg.k, "pages": p is not None,
                    "tokens": p.tokens if p is not None else 0,
                    "source": p.meta.get("source") if p is not None else None}  # fmt: skip
        cfg = self.sae.cfg
        return {"sae": True, "hook": cfg.hook, "out_hook": cfg.out_hook, "arch": cfg.arch, "d_sae": cfg.d_sae,
                "d_in": cfg.d_in, "k": cfg.k, "pages": p is not None,
                "tokens": p.tokens if p is not None else 0,
                "source": p.meta.get("source") if p is not None else None}  # fmt: skip

    def page(self, i: int) -> dict[str, Any]:
        try:
            return self._need_pages().page(i, self.texts())
        except GlassError as e:
            raise APIError(404, str(e), param="feature") from None

    def _search_index(self) -> tuple[list[list[str]], list[str]]:
        """Per latent: the texts of its top tokens, and its contexts joined (built once)."""
        if self._index is None:
            p, texts = self._need_pages(), self.texts()
            before = int(p.meta["before"])
            tops: list[list[str]] = []
            ctxs: list[str] = []
            ids, where = p.top_tokens.tolist(), p.top_where.tolist()
            for i in range(p.d_sae):
                live = [k for k, w in enumerate(where[i]) if w >= 0]
                tops.append([texts[ids[i][k][before]] for k in live])
                ctxs.append("\n".join("".join(texts[t] for t in ids[i][k] if t >= 0) for k in live))
            self._index = (tops, ctxs)
        return self._index

    def search(self, ask: Search) -> dict[str, Any]:
        """Latents matching ``query``: an id ("12" or "#12"); else those whose label (sae
        label's) contains it, then those whose top tokens are the query (most such contexts
        first), then those whose contexts contain it."""
        p = self._need_pages()
        q = ask.query
        m = re.fullmatch(r"\s*#?(?:(\d+)\s*/\s*)?(\d+)\s*", q)
        at = self._flat(m.group(1), m.group(2)) if m else None
        hits: list[tuple[int, str, int]] = []  # (latent, why, score)
        if at is not None and at < p.d_sae:
            hits.append((at, "id", 0))
        elif q:
            tops, ctxs = self._search_index()
            low = q.lower()
            by_label = sorted(i for i in (self._flat(*k.rpartition("/")[::2]) for k, v in p.labels.items()
                                          if low in v["label"].lower()) if i is not None)  # fmt: skip
            hits += [(i, "label", 1) for i in by_label if i < p.d_sae]
            named = set(by_label)
            by_token = [(i, sum(t == q for t in ts)) for i, ts in enumerate(tops) if i not in named]  # fmt: skip
            by_token = sorted([h for h in by_token if h[1] > 0], key=lambda h: -h[1])
            hits += [(i, "token", n) for i, n in by_token]
            seen = {i for i, _ in by_token} | named
            by_text = [(i, c.lower().count(low)) for i, c in enumerate(ctxs) if i not in seen]
            hits += [(i, "context", n) for i, n in sorted(by_text, key=lambda h: -h[1]) if n > 0]
        texts = self.texts()
        rows = []
        for i, why, n in hits[: ask.limit]:
            top = int(p.top_tokens[i, 0, int(p.meta["before"])])
            rows.append({"id": i, "name": self.name(i), "why": why, "matches": n, "density": float(p.density[i]),
                         "label": p.labels.get(self.name(i), {}).get("label"),
                         "max": float(p.top_values[i, 0]),
                         "top_token": texts[top] if top >= 0 else None})  # fmt: skip
        return {"query": q, "results": rows, "total": len(hits)}

    def _flat(self, layer: str | None, index: str) -> int | None:
        """The latent a search's "i" or a CLT's "l/i" names (None: another kind's, or out of range)."""
        if (layer is not None and layer != "") != self.clt:
            return None
        i = int(index)
        if not self.clt:
            return i
        assert layer is not None
        return int(layer) * self.S + i if int(layer) < self.L and i < self.S else None

    # -- a prompt's activations ---------------------------------------------------------------
    def _ids(self, prompt: str) -> list[int]:
        try:
            return encode_prompt(self.model, self.tok, prompt)
        except GlassError as e:
            raise APIError(400, str(e), param="prompt") from None

    def acts(self, ids: list[int]) -> torch.Tensor:
        """f [T, d_sae] of the prompt (float32, on the CPU)."""
        device = next(self.model.parameters()).device
        tokens = torch.tensor([ids], dtype=torch.long, device=device)
        with self.lock, evaluating(self.model), torch.no_grad():
            if isinstance(self.sae, CLT):  # [1, T, L, S] → [1, T, L · S], as the pages number them
                f = self.sae.encode(read_layers(self.model, tokens)[0].to(self.sae.W_enc.dtype)).flatten(-2)  # fmt: skip
            else:
                x, _ = read(self.model, tokens, self.site)
                f = self.sae.encode(x.to(self.sae.W_enc.dtype))
        return f[0].float().cpu()

    def tokens(self, ask: Tokens) -> dict[str, Any]:
        ids = self._ids(ask.prompt)
        f = self.acts(ids)
        values, index = f.topk(min(ask.top, f.shape[1]), dim=-1)
        rows = [[[int(i), round(float(v), 5)] for v, i in zip(vs, js) if v > 0]
                for vs, js in zip(values, index)]  # fmt: skip
        out: dict[str, Any] = {"tokens": [{"id": i, "text": t} for i, t in zip(ids, token_texts(self.tok, ids))],
                               "top": rows, "max": float(f.max()) if f.numel() else 0.0}  # fmt: skip
        if ask.feature is not None:
            if not 0 <= ask.feature < f.shape[1]:
                raise APIError(400, f"feature {ask.feature}: out of range (this SAE has "
                               f"{f.shape[1]} latents)", param="feature")  # fmt: skip
            out["feature"] = {"id": ask.feature, "acts": [round(float(v), 5) for v in f[:, ask.feature]]}  # fmt: skip
        return out

    # -- steering -------------------------------------------------------------------------------
    def _hooks(self, ask: SteerAsk) -> Any:
        """The steering hooks: an SAE's (glassgpt.features.steering), or a CLT's clamp of
        feature l/i, or its raise by the value, at every position (glassgpt.features.clt_steering)."""
        if not isinstance(self.sae, CLT):
            return feature_hooks(self.model, self.sae, ask.feature, ask.mode, float(ask.value))
        if not 0 <= ask.feature < self.L * self.S:
            raise GlassError(f"feature {ask.feature}: out of range (this CLT has {self.L} layers × {self.S})")  # fmt: skip
        l, i, v = ask.feature // self.S, ask.feature % self.S, float(ask.value)
        edit = Edit(l, i, add=v) if ask.mode == "add" else Edit(l, i, value=v)
        return edit_hooks(self.model, self.sae, [edit])

    def steer(self, ask: SteerAsk) -> dict[str, Any]:
        if not math.isfinite(ask.value):
            raise APIError(400, f"value {ask.value}: must be finite", param="value")
        ids = self._ids(ask.prompt)
        try:
            hooks = self._hooks(ask)
        except GlassError as e:
            raise APIError(400, str(e), param="feature") from None
        device = next(self.model.parameters()).device
        tokens = torch.tensor([ids], dtype=torch.long, device=device)
        opts = {"max_new_tokens": ask.max_tokens, "temperature": float(ask.temperature),
                "seed": ask.seed}  # fmt: skip
        out: dict[str, Any] = {}
        with self.lock, evaluating(self.model), torch.no_grad():
            for name, h in (("clean", {}), ("steered", hooks)):
                with self.model.hooks(h):
                    z = self.model(tokens)[0, -1].float()
                    new = generate(self.model, ids, tokenizer=self.tok, **opts) if ask.max_tokens else []  # fmt: skip
                out[name] = (torch.softmax(z[: self.state.n_valid], -1).cpu(), new)
        (p0, new0), (p1, new1) = out["clean"], out["steered"]
        shown = list(dict.fromkeys(p1.topk(TOP).indices.tolist() + p0.topk(TOP).indices.tolist()))
        shown.sort(key=lambda t: -float(p1[t]))
        texts = self.texts()
        return {
            "feature": ask.feature, "name": self.name(ask.feature), "mode": ask.mode, "value": float(ask.value),
            "rows": [{"id": t, "text": texts[t], "p": float(p1[t]), "clean": float(p0[t])}
                     for t in shown[:TOP]],
            "sample": self.state.text(new1), "clean_sample": self.state.text(new0),
            "kl": float((p1 * (p1.clamp_min(1e-30).log() - p0.clamp_min(1e-30).log())).sum()),
        }  # fmt: skip


def folder_extra(folder: str) -> dict[str, Any]:
    """The JSON of the dictionary in ``folder`` (sae.json, a CLT's clt.json): its model, data
    and the model's identity, which ``serve --sae`` checks."""
    if is_clt(folder):
        return json.loads((clt_folder(folder) / CLT_FILE).read_text(encoding="utf-8"))
    return sae_extra(folder)


def load_sae(folder: str, model: Any) -> tuple[SAE | CLT, Any]:
    """(the SAE or CLT in ``folder``, checked against ``model``, in float32 on its device; its
    feature pages, or None with a note on stderr)."""
    device = next(model.parameters()).device
    sae: SAE | CLT
    if is_clt(folder):
        sae = CLT.load(folder, device=device).float()
        check_clt(sae, model)
        found = clt_folder(folder) / FILE
    else:
        sae = SAE.load(folder, device=device).float()
        check_model(sae, model)
        found = sae_folder(folder) / FILE
    if found.is_file():
        return sae, load_pages(found)
    say(
        f"{folder} has no feature pages (glassgpt sae features -c {folder} --data …): the "
        "explorer shows activations and steering only"
    )
    return sae, None


def make_router(state: ServeState, guard: list[Any], sae: SAE | CLT | None, pages: Any = None) -> APIRouter:  # fmt: skip
    """The /api/features routes (all behind ``guard``, the API-key check); without an SAE,
    only /info, answering {"sae": false} (the page then shows no Features tab)."""
    router = APIRouter(prefix="/api/features", dependencies=guard)
    if sae is None:
        router.add_api_route("/info", lambda: {"sae": False}, methods=["GET"])
        return router
    f = Features(state, sae, pages)
    router.add_api_route("/info", f.info, methods=["GET"])
    router.add_api_route("/page/{i}", f.page, methods=["GET"])
    for path, fn in (("/search", f.search), ("/tokens", f.tokens), ("/steer", f.steer)):
        router.add_api_route(path, fn, methods=["POST"])
    router.features = f  # type: ignore[attr-defined]  # (for tests and embedding apps)
    return router
