"""The Graph tab's graphs: files named by ``serve --graph`` and uploads (circuit-tracer's JSON,
glassgpt's or circuit-tracer's own), each checked against the served model before it opens.

A graph belongs to this model when its layers fit (features below L, logits at L + 1), its
token ids are in the vocabulary, and its ``prompt_tokens`` are what this tokenizer shows for
those ids; anything else is one line naming the mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError
from glassgpt.features.graph_json import GraphFile, show
from glassgpt.tokenizer.display import token_texts

FILE = "graph.json"


def graph_paths(paths: list[str]) -> dict[str, Path]:
    """name → file of each ``--graph`` (a graph.json, or a folder searched for them); a name is
    the graph's folder (or the file's stem), made unique by its parents."""
    found: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(path.rglob(FILE)) or sorted(path.glob("*.json"))
        else:
            raise GlassError(f"--graph {p}: no such file or folder")
    named: dict[str, Path] = {}
    for f in found:
        parts = [f.parent.name if f.name == FILE else f.stem]
        parent = f.parent.parent if f.name == FILE else f.parent
        while "/".join(reversed(parts)) in named and parent != parent.parent:
            parts.append(parent.name)
            parent = parent.parent
        named["/".join(reversed(parts))] = f
    return named


@dataclass
class Opened:
    """A graph checked against the model: its JSON, its prompt's ids, and its feature nodes
    by id as (layer, position, feature)."""

    name: str
    doc: dict[str, Any]
    ids: list[int]
    features: dict[str, tuple[int, int, int]]
    kinds: dict[str, str]  # node id → feature_type


def is_feature(node: dict[str, Any]) -> bool:
    return "transcoder" in node["feature_type"]


def check(name: str, g: GraphFile, model: Any, tokenizer: Any, widths: dict[int, int] | None) -> Opened:  # fmt: skip
    """``g`` as :class:`Opened` when it is a graph of ``model`` (module docstring); ``widths``:
    the transcoders' feature count per layer, when the server has them."""
    L, n_vocab = model.config.n_layers, model.config.n_vocab
    other = f"graph {name}: a graph of another model"
    by_pos: dict[int, int] = {}
    features: dict[str, tuple[int, int, int]] = {}
    for node in g.nodes:
        nid, kind = node["node_id"], node["feature_type"]
        if kind == "embedding":
            try:
                token = int(nid.split("_")[1])
            except (IndexError, ValueError):
                raise GlassError(f"graph {name}: embedding node {nid!r} is not E_{{id}}_{{pos}}") from None  # fmt: skip
            if not 0 <= token < n_vocab:
                raise GlassError(f"{other}: token id {token} (node {nid}) is outside this model's vocabulary of {n_vocab}")  # fmt: skip
            by_pos[node["ctx_idx"]] = token
        elif kind == "logit" and node["layer"] != str(L + 1):
            raise GlassError(f"{other}: its logits sit at layer {node['layer']}, this model's at {L + 1} ({L} layers)")  # fmt: skip
        elif is_feature(node) or kind == "mlp reconstruction error":
            layer = int(node["layer"]) if node["layer"].isdigit() else -1
            if not 0 <= layer < L:
                raise GlassError(f"{other}: node {nid} is in layer {node['layer']}, this model has {L} layers")  # fmt: skip
            if is_feature(node):
                parts = nid.split("_")
                if len(parts) != 3 or not all(p.isdigit() for p in parts):
                    raise GlassError(f"graph {name}: feature node {nid!r} is not {{layer}}_{{feature}}_{{pos}}")  # fmt: skip
                index = int(parts[1])
                if widths is not None and index >= widths.get(layer, 0):
                    raise GlassError(f"{other}: feature {index} of layer {layer} (node {nid}); the served transcoders have {widths.get(layer, 0)} there")  # fmt: skip
                features[nid] = (layer, node["ctx_idx"], index)
    if sorted(by_pos) != list(range(len(by_pos))) or not by_pos:
        raise GlassError(f"graph {name}: its embedding nodes do not cover the prompt's positions 0…{len(by_pos) - 1}")  # fmt: skip
    ids = [by_pos[p] for p in range(len(by_pos))]
    if len(ids) > model.config.n_ctx:
        raise GlassError(f"{other}: its prompt is {len(ids)} tokens, longer than this model's context n_ctx={model.config.n_ctx}")  # fmt: skip
    theirs = g.metadata.get("prompt_tokens")
    ours = [show(t) for t in token_texts(tokenizer, ids)]
    if isinstance(theirs, list):  # (circuit-tracer writes tokens raw, glassgpt as shown)
        theirs = [show(str(t)) for t in theirs]
    if isinstance(theirs, list) and theirs != ours:
        k = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))  # fmt: skip
        raise GlassError(f"{other}: its token {k} is {theirs[k] if k < len(theirs) else None!r}, this tokenizer reads its id as {ours[k] if k < len(ours) else None!r}")  # fmt: skip
    doc = {"metadata": g.metadata, "qParams": g.qparams, "nodes": g.nodes, "links": g.links}
    return Opened(name, doc, ids, features, {n["node_id"]: n["feature_type"] for n in g.nodes})
