"""Check an attribution graph's claim by intervening in the real forward pass (the study of
docs/experiments.md, "Cross-layer transcoders on the Shakespeare character model").

    python docs/experiments/clt/check.py RUN CLT GRAPH_DIR [--top N] [--positions last|all]

Reads GRAPH_DIR/graph.json (``glassgpt graph``): the target logit (the model's top token, or
``--target``), and the N feature nodes with the largest direct edge into it (``--by edge``)
or the largest influence (``--by influence``). Prints them, then zeroes them at their
positions (glassgpt.features.clt_steering: the MLP's own output kept, the later layers'
features read again) and prints p(target) and the top token before and after, and
KL(clean ‖ edited) of the next-token distribution; and the same for N other active features
drawn at random from the same (layer, position) cells (seeded), as a control.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glassgpt.checkpoint import open_run
from glassgpt.features.clt import CLT
from glassgpt.features.clt_steering import Edit, intervene
from glassgpt.features.clt_train import read_layers
from glassgpt.tokenizer.display import visible, visible_tokens


def summary(clean: torch.Tensor, edited: torch.Tensor, target: int, texts: list[str]) -> str:
    p, q = clean[-1].double().softmax(-1), edited[-1].double().softmax(-1)
    kl = float((p * (p.log() - q.log())).sum())
    top = int(q.argmax())
    return (f"p(target) {float(p[target]):.3f} → {float(q[target]):.3f}; top after: "
            f"{texts[top]} ({float(q[top]):.3f}); KL {kl:.3f} nats")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("clt")
    ap.add_argument("graph")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--by", choices=("edge", "influence"), default="edge")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run = open_run(args.run)
    model, tok = run.model, run.tokenizer
    clt = CLT.load(args.clt)
    doc = json.loads((Path(args.graph) / "graph.json").read_text())
    prompt = doc["metadata"]["prompt"]
    tokens = torch.tensor(tok.encode(prompt))
    texts = visible_tokens(tok, range(model.config.n_vocab))
    logit = next(n for n in doc["nodes"] if n["feature_type"] == "logit" and n["is_target_logit"])
    target = int(logit["feature"])
    into = {x["source"]: x["weight"] for x in doc["links"] if x["target"] == logit["node_id"]}
    feats = [n for n in doc["nodes"] if n["feature_type"] == "cross layer transcoder"]
    if args.by == "edge":
        feats.sort(key=lambda n: -into.get(n["node_id"], 0.0))
    else:
        feats.sort(key=lambda n: n["influence"])
    chosen = feats[: args.top]
    print(f"prompt {visible(prompt)}; target {texts[target]} (p={logit['token_prob']:.3f}); "
          f"{len(feats)} feature nodes kept")  # fmt: skip
    for n in chosen:
        layer, index, pos = (int(v) for v in n["node_id"].split("_"))
        print(f"  feature {layer}/{index} at {pos} ({texts[int(tokens[pos])]}): activation "
              f"{n['activation']:.2f}, edge to the target {into.get(n['node_id'], 0.0):+.3f}, "
              f"influence rank {sorted(f['influence'] for f in feats).index(n['influence']) + 1}")  # fmt: skip
    edits = []
    for n in chosen:
        layer, index, pos = (int(v) for v in n["node_id"].split("_"))
        edits.append(Edit(layer, index, pos=pos, scale=0.0))
    clean, edited = intervene(model, clt, tokens, edits)
    print(f"zeroed the {len(edits)}: " + summary(clean, edited, target, texts))
    # control: as many other active features, in the same (layer, position) cells
    with torch.no_grad():
        u, _ = read_layers(model, tokens[None])
        acts = clt.encode(u[0])  # [T, L, S]
    gen = torch.Generator().manual_seed(args.seed)
    named = {(e.layer, e.pos, e.feature) for e in edits}
    control = []
    for e in edits:
        others = [int(i) for i in (acts[e.pos, e.layer] > 0).nonzero().flatten()
                  if (e.layer, e.pos, int(i)) not in named]  # fmt: skip
        pick = others[int(torch.randint(len(others), (1,), generator=gen))] if others else None
        if pick is not None:
            control.append(Edit(e.layer, pick, pos=e.pos, scale=0.0))
    _, edited = intervene(model, clt, tokens, control)
    print(
        f"control, {len(control)} other active features zeroed: "
        + summary(clean, edited, target, texts)
    )


if __name__ == "__main__":
    main()
