"""The explorer's Graph tab: attribution graphs traced, opened and intervened on.

    GET  /api/graph/info               transcoders (kind, layers, pages), the graph files, the caps
    GET  /api/graph/open?name=NAME     a graph file (``serve --graph``) or one opened before
    POST /api/graph/upload             {doc}: a graph JSON from the browser (glassgpt's or
                                       circuit-tracer's), checked against this model
    POST /api/graph/trace              {prompt, node_threshold, edge_threshold,
                                       max_feature_nodes, target}: attribute + prune, as
                                       ``glassgpt graph`` does
    GET  /api/graph/feature/{l}/{i}    feature i of layer l: its label and its page
    POST /api/graph/intervene          {graph, edits: [{node, mode, value}]}: the next-token
                                       distribution and a sample of the model's real forward
                                       pass with those feature edits (graph_edit), beside the
                                       unedited ones, and KL(edited ‖ clean)

Every graph comes back as circuit-tracer's JSON (``features.graph_json``) with the features'
labels (``labels.json``) in each node's ``clerp``. Tracing and intervening need the
transcoders (``serve --transcoders``); opening a file does not. Every forward holds the
scheduler's lock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from glassgpt.errors import GlassError
from glassgpt.features.graph_json import from_doc, load_json, to_json
from glassgpt.features.graph_prune import check_threshold, prune, scores
from glassgpt.features.graphs import attribute
from glassgpt.features.labels import key, read_labels
from glassgpt.features.pages import FILE as PAGES
from glassgpt.features.pages import load_pages
from glassgpt.features.replacement import Transcoders
from glassgpt.features.sae import sae_folder
from glassgpt.inspect.cache import evaluating
from glassgpt.inspect.report import encode_prompt
from glassgpt.serve.errors import APIError
from glassgpt.serve.graph_edit import Edit, edit_hooks, last_logits, sample
from glassgpt.serve.graph_files import Opened, check
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.display import token_texts

TOP = 10  # tokens shown in the next-token bars
KEEP = 32  # traced and uploaded graphs held (the oldest go first)
MAX_FEATURE_NODES = 4096  # the command's default, the most a trace may ask


class TraceAsk(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    node_threshold: StrictFloat | StrictInt = 0.8
    edge_threshold: StrictFloat | StrictInt = 0.98
    max_feature_nodes: StrictInt = Field(512, ge=1, le=MAX_FEATURE_NODES)
    target: str | None = None


class EditAsk(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    node: str
    mode: Literal["zero", "scale", "clamp"]
    value: StrictFloat | StrictInt = 0.0


class InterveneAsk(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    graph: str
    edits: list[EditAsk] = Field(min_length=1, max_length=256)
    max_tokens: StrictInt = Field(24, ge=0, le=128)
    temperature: StrictFloat | StrictInt = Field(1.0, ge=0.0, le=5.0)
    seed: StrictInt = 0


class UploadAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc: dict[str, Any]
    name: str | None = None


class Graphs:
    """The served model's transcoders (or None) and its graphs."""

    def __init__(self, state: ServeState, transcoders: Transcoders | None, files: dict[str, Path]) -> None:  # fmt: skip
        self.state, self.model, self.tok = state, state.model, state.tokenizer
        self.lock = state.scheduler.lock
        self.files = files
        self.folders = dict(transcoders.folders) if transcoders is not None else {}
        self.tc = None
        if transcoders is not None:
            transcoders.check(self.model)
            self.tc = transcoders.to(self.model.W_U.dtype)
        L = self.model.config.n_layers
        self.widths = {l: self.tc.width(l) for l in range(L) if self.tc.has(l)} if self.tc else None
        self.opened: OrderedDict[str, Opened] = OrderedDict()
        self.n_traced = 0
        self._pages: dict[int, Any] = {}
        self._texts: list[str] | None = None

    # -- what there is ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        tc = self.tc
        return {"transcoders": tc is not None, "kind": tc.name if tc else None,
                "layers": sorted(self.widths) if self.widths else [],
                "widths": self.widths or {}, "n_layers": self.model.config.n_layers,
                "pages": [l for l in sorted(self.folders) if self._page_file(l)],
                "files": sorted(self.files), "max_feature_nodes": MAX_FEATURE_NODES,
                "n_ctx": self.state.n_ctx}  # fmt: skip

    def _page_file(self, layer: int) -> Path | None:
        """Layer ``layer``'s feature pages: its transcoder's, or the CLT's (one file, every
        layer's features in it)."""
        if self.tc is None or layer not in self.folders:
            return None
        folder = self.folders[layer]
        path = (folder if self.tc.clt is not None else sae_folder(folder)) / PAGES
        return path if path.is_file() else None

    def _labels(self) -> dict[int, dict[str, dict[str, Any]]]:
        """layer → its folder's labels (read afresh: ``sae label`` may write them meanwhile)."""
        try:
            return {
                l: read_labels(sae_folder(f)) or read_labels(f) for l, f in self.folders.items()
            }
        except GlassError as e:
            raise APIError(500, str(e), type="server_error") from None

    def _key(self, layer: int, index: int) -> str:
        return key(index, layer if self.tc is not None and self.tc.clt is not None else None)

    def _answer(self, g: Opened, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """``g``'s JSON for the page, each unlabelled feature given its label."""
        labels = self._labels()
        nodes = []
        for n in g.doc["nodes"]:
            where = g.features.get(n["node_id"])
            if where is not None and not n.get("clerp"):
                found = labels.get(where[0], {}).get(self._key(where[0], where[2]))
                if found:
                    n = dict(n, clerp=found["label"])
            nodes.append(n)
        return {"name": g.name, "doc": dict(g.doc, nodes=nodes), "editable": self.tc is not None,
                **(extra or {})}  # fmt: skip

    def _keep(self, g: Opened) -> Opened:
        self.opened[g.name] = g
        self.opened.move_to_end(g.name)
        while len(self.opened) > KEEP:
            self.opened.popitem(last=False)
        return g

    def _check(self, name: str, graph: Any) -> Opened:
        try:
            return check(name, graph, self.model, self.tok, self.widths)
        except GlassError as e:
            raise APIError(400, str(e), param="graph") from None

    # -- opening ------------------------------------------------------------------------------
    def open(self, name: str) -> dict[str, Any]:
        if name in self.opened:
            return self._answer(self.opened[name])
        if name not in self.files:
            raise APIError(404, f"no graph named {name!r}: open one of --graph's files, upload one, or trace a prompt", param="name")  # fmt: skip
        try:
            graph = load_json(self.files[name])
        except GlassError as e:
            raise APIError(400, str(e), param="name") from None
        return self._answer(self._keep(self._check(name, graph)))

    def upload(self, ask: UploadAsk) -> dict[str, Any]:
        name = ask.name or str(ask.doc.get("metadata", {}).get("slug") or "upload")
        name = f"upload:{name}"
        try:
            graph = from_doc(ask.doc, name)
        except GlassError as e:
            raise APIError(400, str(e), param="doc") from None
        except (TypeError, AttributeError) as e:
            raise APIError(400, f"{name}: not a circuit-tracer graph ({e})", param="doc") from None
        return self._answer(self._keep(self._check(name, graph)))

    # -- tracing --------------------------------------------------------------------------------
    def _need_tc(self) -> Transcoders:
        if self.tc is None:
            raise APIError(400, "this server has no transcoders: restart it with glassgpt serve -c RUN --transcoders DIR")  # fmt: skip
        return self.tc

    def _ids(self, text: str, param: str) -> list[int]:
        try:
            return encode_prompt(self.model, self.tok, text)
        except GlassError as e:
            raise APIError(400, str(e), param=param) from None

    def trace(self, ask: TraceAsk) -> dict[str, Any]:
        tc = self._need_tc()
        try:
            node_t = check_threshold(float(ask.node_threshold), "node_threshold")
            edge_t = check_threshold(float(ask.edge_threshold), "edge_threshold")
        except GlassError as e:
            raise APIError(400, str(e)) from None
        ids = self._ids(ask.prompt, "prompt")
        logits = None
        if ask.target is not None:
            logits = self._ids(ask.target, "target") if ask.target else []
            if len(logits) != 1:
                raise APIError(400, f"target {ask.target!r}: is {len(logits)} tokens; give one token", param="target")  # fmt: skip
        with self.lock, evaluating(self.model):
            graph = attribute(self.model, tc, ids, prompt=ask.prompt, logits=logits,
                              max_feature_nodes=ask.max_feature_nodes)  # fmt: skip
        pruned = prune(graph, node_t, edge_t)
        replacement, completeness = scores(graph)
        self.n_traced += 1
        name = f"trace-{self.n_traced}"
        scan = " ".join(sorted({str(f) for f in self.folders.values()})) or "glassgpt"
        doc = to_json(graph, pruned, slug=name, scan=scan, node_threshold=node_t,
                      prompt_tokens=token_texts(self.tok, ids),
                      logit_text=token_texts(self.tok, graph.logit_tokens),
                      transcoder_list=sorted({str(f) for f in self.folders.values()}))  # fmt: skip
        opened = self._keep(self._check(name, from_doc(doc, name)))
        extra = {"scores": {"replacement": replacement, "completeness": completeness},
                 "active_features": graph.n_active, "feature_rows": graph.n_features}  # fmt: skip
        return self._answer(opened, extra)

    # -- a feature --------------------------------------------------------------------------------
    def feature(self, layer: int, i: int) -> dict[str, Any]:
        if self.widths is None or layer not in self.widths:
            raise APIError(404, f"layer {layer}: the served transcoders have no features there", param="layer")  # fmt: skip
        if not 0 <= i < self.widths[layer]:
            raise APIError(404, f"feature {i}: out of range (layer {layer} has {self.widths[layer]})", param="feature")  # fmt: skip
        found = self._labels().get(layer, {}).get(self._key(layer, i)) or {}
        page, path = None, self._page_file(layer)
        if path is not None:
            if layer not in self._pages:  # a CLT's one file, loaded once for every layer
                same = [p for l, p in self._pages.items() if self._page_file(l) == path]
                self._pages[layer] = same[0] if same else load_pages(path)
            if self._texts is None:
                self._texts = token_texts(self.tok, range(self.model.config.n_vocab))
            # a CLT's pages number feature i of layer l as l · d_sae + i (glassgpt.features.pages)
            at = layer * self.widths[layer] + i if self.tc.clt is not None else i  # type: ignore[union-attr]
            page = self._pages[layer].page(at, self._texts)
        return {"layer": layer, "feature": i, "label": found.get("label"),
                "detection": found.get("detection"), "page": page}  # fmt: skip

    # -- intervening ------------------------------------------------------------------------------
    def intervene(self, ask: InterveneAsk) -> dict[str, Any]:
        tc = self._need_tc()
        g = self.opened.get(ask.graph)
        if g is None:
            raise APIError(400, f"graph {ask.graph!r}: not open (open, upload or trace it first)", param="graph")  # fmt: skip
        edits = []
        for k, e in enumerate(ask.edits):
            if e.node not in g.kinds:
                raise APIError(400, f"edits[{k}].node {e.node!r}: no such node in graph {g.name}", param="edits")  # fmt: skip
            if e.node not in g.features:
                raise APIError(400, f"edits[{k}].node {e.node!r}: {_a(g.kinds[e.node])} node; only features can be edited", param="edits")  # fmt: skip
            if not math.isfinite(e.value):
                raise APIError(400, f"edits[{k}].value {e.value}: must be finite", param="edits")
            layer, pos, index = g.features[e.node]
            edits.append(Edit(layer, pos, index, e.mode, float(e.value)))
        hooks = edit_hooks(self.model, tc, edits)
        n = self.state.n_valid
        opts = {"n": ask.max_tokens, "temperature": float(ask.temperature), "seed": ask.seed, "n_valid": n}  # fmt: skip
        with self.lock, evaluating(self.model), torch.no_grad():
            z0 = last_logits(self.model, g.ids, {})[:n].double().cpu()
            z1 = last_logits(self.model, g.ids, hooks)[:n].double().cpu()
            new0 = sample(self.model, g.ids, {}, **opts)
            new1 = sample(self.model, g.ids, hooks, **opts)
        p0, p1 = torch.softmax(z0, -1), torch.softmax(z1, -1)
        shown = list(dict.fromkeys(p1.topk(min(TOP, n)).indices.tolist() + p0.topk(min(TOP, n)).indices.tolist()))  # fmt: skip
        shown = sorted(shown, key=lambda t: -float(p1[t]))[:TOP]
        texts = token_texts(self.tok, shown)
        kl = float((p1 * (p1.clamp_min(1e-300).log() - p0.clamp_min(1e-300).log())).sum())
        return {"graph": g.name, "edits": [e.__dict__ for e in edits], "kl": kl,
                "rows": [{"id": t, "text": s, "p": float(p1[t]), "clean": float(p0[t]),
                          "logit": float(z1[t]), "clean_logit": float(z0[t])}
                         for t, s in zip(shown, texts)],
                "sample": self.state.text(new1), "clean_sample": self.state.text(new0),
                "prompt": self.state.text(g.ids)}  # fmt: skip


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def make_router(state: ServeState, guard: list[Any], transcoders: Transcoders | None = None,
                files: dict[str, Path] | None = None) -> APIRouter:  # fmt: skip
    """The /api/graph routes (behind ``guard``); without transcoders or files, only /info,
    answering {"graphs": false} (the page then shows no Graph tab)."""
    router = APIRouter(prefix="/api/graph", dependencies=guard)
    if transcoders is None and not files:
        router.add_api_route("/info", lambda: {"graphs": False}, methods=["GET"])
        return router
    g = Graphs(state, transcoders, files or {})
    router.add_api_route("/info", lambda: {"graphs": True, **g.info()}, methods=["GET"])
    router.add_api_route("/open", g.open, methods=["GET"])
    router.add_api_route("/feature/{layer}/{i}", g.feature, methods=["GET"])
    for path, fn in (("/upload", g.upload), ("/trace", g.trace), ("/intervene", g.intervene)):
        router.add_api_route(path, fn, methods=["POST"])
    router.graphs = g  # type: ignore[attr-defined]  # (for tests and embedding apps)
    return router
