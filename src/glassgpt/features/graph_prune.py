"""Pruning an attribution graph by indirect influence, and its two scores (circuit-tracer's
definitions, Ameisen et al. 2025 §"Graph pruning").

    Â        = |A| with each row divided by its sum            (the share of a node's input)
    I        = w (Â + Â² + Â³ + …)                             w: the logit targets' weights
    keep     nodes in order of I until their share of Σ I reaches node_threshold (tokens and
             logit targets always);
             edges scored Â_ts · (I + w)_t on the pruned graph, kept likewise to edge_threshold;
             then features and errors without an outgoing edge, and features without an
             incoming one, are dropped until none is left to drop
    replacement  = I(tokens) / (I(tokens) + I(errors))        (token → logit influence not
                                                              through an error)
    completeness = Σ_t (1 − Σ_{s error} Â_ts)(I + w)_t / Σ_t (I + w)_t

A threshold of 1.0 keeps every node (or edge), even those of no influence (circuit-tracer's
cut drops them there too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.graphs import Graph, work_dtype


def normalized(A: Tensor, mask: Tensor | None = None) -> Tensor:
    """Â: |A| (times ``mask`` [N] on rows and columns) with rows summing to 1 (rows of 0 stay
    0): one copy of A in :func:`work_dtype`, the rest in place."""
    a = A.abs().to(work_dtype(A)) if A.dtype != work_dtype(A) else A.abs()
    if mask is not None:
        a *= mask[:, None]
        a *= mask[None, :]
    a /= a.sum(1, keepdim=True).clamp_min(1e-10)
    return a


def influence(An: Tensor, weights: Tensor, max_iter: int = 10_000) -> Tensor:
    """w (Â + Â² + …) [N]: the graph is acyclic, so the series ends."""
    current = weights.to(An.dtype) @ An
    total = current.clone()
    for _ in range(max_iter):
        current = current @ An
        if not bool(current.any()):
            return total
        total += current
    raise GlassError("the graph's influence did not converge (is it acyclic?)")


def threshold_of(scores: Tensor, share: float) -> float:
    """The least score kept when keeping, highest first, a ``share`` of the scores' sum.

    >>> threshold_of(torch.tensor([1.0, 5.0, 3.0, 1.0]), 0.8)
    3.0
    """
    ordered = _sorted_down(scores.flatten())
    total = ordered.sum()
    if share >= 1.0 or total <= 0:
        return float(ordered[-1]) if len(ordered) else 0.0
    cumulative = ordered.cumsum(0) / total
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)  # fmt: skip
    return float(ordered[index])


def _sorted_down(values: Tensor) -> Tensor:
    """values sorted, largest first, without torch.sort's index tensor (8 bytes a value):
    NumPy sorts a copy of the values alone."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64):
        return values.sort(descending=True).values
    flat = values.numpy().copy()
    flat.sort()
    return torch.from_numpy(flat[::-1].copy())


def logit_weights(graph: Graph) -> Tensor:
    w = torch.zeros(graph.n_nodes, dtype=torch.float64)
    w[graph.logit_start :] = graph.logit_probs.double()
    return w


@dataclass
class Pruned:
    """Which nodes and edges a pruning keeps ([N] and [N, N] bool), and each node's influence."""

    nodes: Tensor
    edges: Tensor
    influence: Tensor  # [N] I + w

    @property
    def n_nodes(self) -> int:
        return int(self.nodes.sum())

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())


def check_threshold(value: float, flag: str) -> float:
    if not 0.0 < value <= 1.0:
        raise GlassError(f"{flag}: must be in (0, 1], got {value}")
    return value


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The nodes and edges kept (module docstring). Tokens and logit targets are always kept."""
    check_threshold(node_threshold, "--node-threshold")
    check_threshold(edge_threshold, "--edge-threshold")
    n_f = graph.n_features
    w = logit_weights(graph)
    A = graph.adjacency  # its copies: Â once, then the edge scores in place of it
    An = normalized(A)
    node_inf = influence(An, w).double()
    nodes = torch.ones(graph.n_nodes, dtype=torch.bool)
    if node_threshold < 1.0:
        nodes = node_inf >= threshold_of(node_inf, node_threshold)
        nodes[graph.token_start :] = True
    del An
    edge_scores = normalized(A, nodes.to(work_dtype(A)))
    edge_scores *= (influence(edge_scores, w) + w.to(edge_scores.dtype))[:, None]
    edges = A != 0
    edges &= nodes[:, None]
    edges &= nodes[None, :]
    if edge_threshold < 1.0:
        edges &= edge_scores >= threshold_of(edge_scores[edges], edge_threshold)
        del edge_scores
        while True:  # drop what the cut left without an outgoing (or, features, incoming) edge
            before = nodes.clone()
            nodes[: graph.token_start] &= edges[:, : graph.token_start].any(0)
            nodes[:n_f] &= edges[:n_f].any(1)
            edges &= nodes[:, None] & nodes[None, :]
            if bool((nodes == before).all()):
                break
    return Pruned(nodes, edges, node_inf + w)


def scores(graph: Graph) -> tuple[float, float]:
    """(replacement score, completeness score) of the unpruned graph (module docstring)."""
    w = logit_weights(graph)
    An = normalized(graph.adjacency)
    inf = influence(An, w)
    errors = slice(graph.error_start, graph.token_start)
    tokens = slice(graph.token_start, graph.logit_start)
    tok, err = float(inf[tokens].sum()), float(inf[errors].sum())
    replacement = tok / (tok + err) if tok + err > 0 else 1.0
    out = inf + w
    completeness = float(((1 - An[:, errors].sum(1)) * out).sum() / out.sum())
    return replacement, completeness
