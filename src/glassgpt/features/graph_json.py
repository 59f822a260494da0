"""An attribution graph as circuit-tracer's JSON: the schema of its ``frontend/graph_models``
(the file its local viewer and Neuronpedia's graph upload read), written and read back.

    {"metadata": {slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold,
                  schema_version},
     "qParams":  {pinnedIds, supernodes, linkType, clickedId, sg_pos},
     "nodes":    [{node_id, feature, layer, ctx_idx, feature_type, token_prob,
                   is_target_logit, run_idx, reverse_ctx_idx, jsNodeId, clerp, influence,
                   activation}],
     "links":    [{source, target, weight}]}

Node ids as circuit-tracer 0.5 makes them: a feature ``{layer}_{feature}_{pos}`` (its
``feature`` the Cantor pairing of layer and index), an error ``0_{layer}_{pos}``, a token
``E_{id}_{pos}``, a logit ``{L+1}_{id}_{pos}`` (a direction target: id n_vocab + k, as
circuit-tracer numbers its virtual targets). ``influence``: the node's cumulative share of
influence, highest first (what circuit-tracer writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glassgpt.errors import InputFileError
from glassgpt.features.graph_prune import Pruned
from glassgpt.features.graphs import Graph
from glassgpt.storage import atomic_write

SCHEMA_VERSION = 1
NODE_DEFAULTS: dict[str, Any] = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0,
                                 "reverse_ctx_idx": 0, "clerp": "", "influence": None,
                                 "activation": None}  # fmt: skip


def cantor(x: int, y: int) -> int:
    """The Cantor pairing (x + y)(x + y + 1)/2 + y: one integer per (layer, feature).

    >>> cantor(0, 0), cantor(1, 0), cantor(0, 1), cantor(2, 5)
    (0, 1, 2, 33)
    """
    return (x + y) * (x + y + 1) // 2 + y


def show(text: str) -> str:
    """A token as circuit-tracer shows it: newline ⏎, tab →, carriage return ↵."""
    return text.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def cumulative_shares(influence: torch.Tensor) -> torch.Tensor:
    """Each node's cumulative share of Σ influence, nodes taken highest first."""
    order = influence.sort(descending=True)
    shares = order.values.cumsum(0) / order.values.sum().clamp_min(1e-300)
    out = torch.zeros_like(influence)
    out[order.indices] = shares
    return out


FIELDS = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit",
          "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation")  # fmt: skip


def node_doc(graph: Graph, i: int, *, influence: float, logit_text: list[str]) -> dict[str, Any]:  # fmt: skip
    """Node i of the graph as circuit-tracer's ``Node``."""
    kind, layer, pos, idx = graph.node(i)
    base = dict(NODE_DEFAULTS, ctx_idx=pos, influence=influence)
    if kind == "feature":
        return dict(base, node_id=f"{layer}_{idx}_{pos}", feature=cantor(layer, idx),
                    layer=str(layer), feature_type="cross layer transcoder",
                    jsNodeId=f"{layer}_{idx}-0", activation=float(graph.activations[i]))  # fmt: skip
    if kind == "error":
        return dict(base, node_id=f"0_{layer}_{pos}", feature=-1, layer=str(layer),
                    feature_type="mlp reconstruction error", jsNodeId=f"{layer}_{pos}-0")  # fmt: skip
    if kind == "token":
        return dict(base, node_id=f"E_{idx}_{pos}", feature=pos, layer="E",
                    feature_type="embedding", jsNodeId=f"E_{idx}-{pos}")  # fmt: skip
    k = i - graph.logit_start
    p = float(graph.logit_probs[k])
    top = str(graph.n_layers + 1)
    return dict(base, node_id=f"{top}_{idx}_{pos}", feature=idx, layer=top, influence=None,
                feature_type="logit", token_prob=p, is_target_logit=k == 0,
                jsNodeId=f"L_{idx}-{pos}", clerp=f'Output "{show(logit_text[k])}" (p={p:.3f})')  # fmt: skip


def to_json(
    graph: Graph, pruned: Pruned, *, slug: str, scan: str, prompt_tokens: list[str],
    logit_text: list[str], node_threshold: float, transcoder_list: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The pruned graph as circuit-tracer's ``Model`` (module docstring)."""
    shares = cumulative_shares(pruned.influence).tolist()
    keep = pruned.nodes.nonzero().flatten().tolist()
    nodes = {}
    for i in keep:  # each in the schema's field order
        node = node_doc(graph, i, influence=shares[i], logit_text=logit_text)
        nodes[i] = {key: node[key] for key in FIELDS}
    targets, sources = pruned.edges.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for t, s, w in zip(targets.tolist(), sources.tolist(), weights, strict=True)
             if s in nodes and t in nodes]  # fmt: skip
    linked = {x for link in links for x in (link["source"], link["target"])}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]  # fmt: skip
    meta = {"slug": slug, "scan": scan, "transcoder_list": transcoder_list or [],
            "prompt_tokens": [show(t) for t in prompt_tokens], "prompt": graph.prompt,
            "node_threshold": node_threshold, "schema_version": SCHEMA_VERSION}  # fmt: skip
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}  # fmt: skip
    return {"metadata": meta, "qParams": qparams, "nodes": used, "links": links}


def save_json(path: str | Path, doc: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())
    return path


@dataclass
class GraphFile:
    """A graph read from circuit-tracer's JSON (ours or circuit-tracer's own)."""

    metadata: dict[str, Any]
    qparams: dict[str, Any]
    nodes: list[dict[str, Any]]
    links: list[dict[str, Any]]

    def node(self, node_id: str) -> dict[str, Any]:
        return next(n for n in self.nodes if n["node_id"] == node_id)


_NODE_TYPES = {"node_id": str, "feature": int, "layer": str, "ctx_idx": int, "feature_type": str,
               "jsNodeId": str}  # fmt: skip


def load_json(path: str | Path) -> GraphFile:
    """The graph in ``path`` (circuit-tracer's schema); one line naming what is missing."""
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise InputFileError(f"{path}: unreadable ({e})") from None
    return from_doc(doc, str(path))


def from_doc(doc: Any, path: str) -> GraphFile:
    """The graph in ``doc`` (the parsed JSON of circuit-tracer's schema, read from ``path``,
    the name the errors give); one line naming what is missing."""
    if not isinstance(doc, dict):
        raise InputFileError(f"{path}: not a graph (a JSON object with metadata, nodes, links)")
    for key in ("metadata", "nodes", "links"):
        if key not in doc:
            raise InputFileError(f"{path}: not a circuit-tracer graph (no {key!r})")
    nodes = []
    for i, raw in enumerate(doc["nodes"]):
        node = dict(NODE_DEFAULTS, **raw)
        node.setdefault("jsNodeId", node.get("node_id"))
        for key, kind in _NODE_TYPES.items():
            if not isinstance(node.get(key), kind):
                raise InputFileError(f"{path}: nodes[{i}].{key}: expected {kind.__name__}, got {node.get(key)!r}")  # fmt: skip
        nodes.append(node)
    ids = {n["node_id"] for n in nodes}
    for i, link in enumerate(doc["links"]):
        for key in ("source", "target"):
            if link.get(key) not in ids:
                raise InputFileError(f"{path}: links[{i}].{key} {link.get(key)!r} is no node")
        if not isinstance(link.get("weight"), (int, float)):
            raise InputFileError(f"{path}: links[{i}].weight: expected a number")
    return GraphFile(doc["metadata"], doc.get("qParams", {}), nodes, doc["links"])
