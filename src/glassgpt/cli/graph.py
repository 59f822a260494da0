"""``glassgpt graph``: the attribution graph of a prompt, through the model's transcoders.

The MLPs are replaced by the transcoders' features (a CLT folder, one transcoder folder, or a
folder of per-layer ones) plus error nodes, attention and norms frozen, and the direct effects
among features, errors, tokens and the top logits (or ``--target``'s) computed
(:func:`glassgpt.features.graphs.attribute`), pruned (:func:`glassgpt.features.graph_prune.prune`)
and written as circuit-tracer's JSON (``-o DIR/graph.json``, for its viewer or Neuronpedia's
upload). Prints the graph's size and its replacement and completeness scores.

    glassgpt graph -c RUN --transcoders DIR --prompt TEXT -o DIR [--target TOKEN]
        [--node-threshold 0.8 --edge-threshold 0.98 --max-feature-nodes N]
        [--adjacency-dtype bfloat16 --max-memory GIB --offload]

A graph whose adjacency would pass ``--max-memory`` (default: half the memory available) keeps
fewer feature nodes, the most influential, and says so on stderr: never an out-of-memory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import (
    add_checkpoint,
    add_device,
    add_json,
    add_output,
    add_prompt,
    add_tokenizer,
    read_prompt,
)
from glassgpt.console import say
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.features.graph_json import save_json, to_json
from glassgpt.features.graph_prune import check_threshold, prune, scores
from glassgpt.features.graphs import attribute
from glassgpt.features.replacement import open_transcoders
from glassgpt.inspect.report import encode_prompt
from glassgpt.tokenizer.display import token_texts
from glassgpt.train.inputs import available_memory

FILE = "graph.json"
ADJACENCY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# bytes per adjacency entry that pruning adds: |A| in float32, the edge mask, the kept edges'
# scores and NumPy's sorted copy of them
PRUNE_BYTES = 4 + 1 + 4 + 4


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Trace a prompt through the model's transcoders: the attribution graph of direct "
        "effects among active features, error nodes, tokens and the top logits, pruned by "
        "influence, written as circuit-tracer's graph JSON."
    )
    add_checkpoint(parser)
    parser.add_argument("--transcoders", required=True, metavar="DIR",
                        help="a CLT folder, a transcoder folder, or a folder of per-layer "
                             "transcoder folders (sae train --arch transcoder)")  # fmt: skip
    add_prompt(parser, required=True, help="the text to trace", file_help="read it from FILE (UTF-8)")  # fmt: skip
    add_output(parser, required=True, metavar="DIR", help=f"the folder for {FILE}")
    parser.add_argument("--target", metavar="TOKEN", default=None,
                        help="attribute from this token's logit (one token) instead of the top logits")  # fmt: skip
    parser.add_argument("--node-threshold", type=float, default=0.8, metavar="X",
                        help="keep the nodes of this share of influence (0, 1] (default 0.8)")  # fmt: skip
    parser.add_argument("--edge-threshold", type=float, default=0.98, metavar="X",
                        help="keep the edges of this share of influence (0, 1] (default 0.98)")  # fmt: skip
    parser.add_argument("--max-feature-nodes", type=int, default=4096, metavar="N",
                        help="at most N feature rows, the most influential (default 4096)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=32, metavar="B",
                        help="targets per backward pass (default 32)")  # fmt: skip
    parser.add_argument("--adjacency-dtype", choices=tuple(ADJACENCY_DTYPES), default="float32",
                        help="the adjacency's dtype: bfloat16 holds it in half the memory (default float32)")  # fmt: skip
    parser.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                        help="the most the graph and its pruning may take, in GiB; a larger graph "
                             "keeps fewer feature nodes, with a note (default: half the memory "
                             "available now)")  # fmt: skip
    parser.add_argument("--offload", action="store_true",
                        help="keep the transcoders' weights on the host while the rows are "
                             "computed (a GPU model; on a CPU it changes nothing)")  # fmt: skip
    parser.add_argument("--slug", default=None, help="the graph's name in the viewer (default: the folder's)")  # fmt: skip
    add_device(parser)
    add_tokenizer(parser)
    add_json(parser, help="print the scores as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    node_t = check_threshold(args.node_threshold, "--node-threshold")
    edge_t = check_threshold(args.edge_threshold, "--edge-threshold")
    if args.max_feature_nodes < 1:
        raise GlassError(f"--max-feature-nodes: must be ≥ 1, got {args.max_feature_nodes}")
    if args.max_memory is not None and not args.max_memory > 0:
        raise GlassError(f"--max-memory: must be > 0 GiB, got {args.max_memory}")
    prompt = read_prompt(args) or ""
    device = parse_device(args.device)
    loaded = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device)
    model, tokenizer = loaded.model, loaded.needs_tokenizer()
    assert model is not None
    model.eval()
    transcoders = open_transcoders(args.transcoders, device=device)
    transcoders.check(model)
    ids = encode_prompt(model, tokenizer, prompt)
    logits = None
    if args.target is not None:
        target = encode_prompt(model, tokenizer, args.target) if args.target else []
        if len(target) != 1:
            raise GlassError(f"--target {args.target!r}: is {len(target)} tokens; give one token")
        logits = target
    budget = (
        args.max_memory * 2**30
        if args.max_memory is not None
        else (available_memory(torch.device("cpu")) or 2**32) / 2
    )  # the adjacency lives on the host
    dtype = ADJACENCY_DTYPES[args.adjacency_dtype]
    size = torch.tensor([], dtype=dtype).element_size()
    max_memory = budget * size / (size + PRUNE_BYTES)  # the adjacency's share of the budget
    graph = attribute(model, transcoders.to(model.W_U.dtype), ids, prompt=prompt, logits=logits,
                      max_feature_nodes=args.max_feature_nodes, batch_size=args.batch_size,
                      dtype=dtype, max_memory=max_memory,
                      offload=args.offload)  # fmt: skip
    for note in graph.notes:
        say(note)
    if graph.n_active > graph.n_features and not graph.notes:
        say(f"{graph.n_active} active features: the {graph.n_features} most influential kept (--max-feature-nodes)")  # fmt: skip
    pruned = prune(graph, node_t, edge_t)
    replacement, completeness = scores(graph)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise GlassError(f"-o {out}: is a file, not a folder")
    doc = to_json(graph, pruned, slug=args.slug or out.resolve().name, scan=str(args.transcoders),
                  prompt_tokens=token_texts(tokenizer, ids),
                  logit_text=token_texts(tokenizer, graph.logit_tokens),
                  node_threshold=node_t, transcoder_list=[str(args.transcoders)])  # fmt: skip
    path = save_json(out / FILE, doc)
    summary = {"graph": str(path), "tokens": len(ids), "active_features": graph.n_active,
               "feature_nodes": graph.n_features, "nodes_kept": len(doc["nodes"]),
               "edges_kept": len(doc["links"]), "replacement_score": replacement,
               "completeness_score": completeness,
               "targets": token_texts(tokenizer, graph.logit_tokens)}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{path}: {summary['nodes_kept']} nodes, {summary['edges_kept']} edges "
          f"({graph.n_active} active features on {len(ids)} tokens)")  # fmt: skip
    print(f"replacement score {replacement:.4f} | completeness score {completeness:.4f}")
    return 0
