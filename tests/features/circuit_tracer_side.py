"""The circuit-tracer side of tests/features/test_graph_json.py, run by an interpreter that has
circuit_tracer (its own venv: circuit-tracer pins transformer-lens). Imports nothing from
glassgpt; talks through files in one folder.

    python circuit_tracer_side.py DIR     reads DIR/job.json and DIR/adjacency.safetensors:
      circuit-tracer's Graph of that adjacency, pruned by its prune_graph and scored by its
      compute_graph_scores → DIR/out.safetensors {node_mask, edge_mask}; DIR/graph.json
      validated by its pydantic Model, and each node remade by its Node classmethods
      → DIR/out.json {replacement, completeness, nodes_checked, mismatches}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: Path) -> None:
    import torch
    from circuit_tracer.attribution.targets import LogitTarget
    from circuit_tracer.frontend.graph_models import Model, Node
    from circuit_tracer.graph import Graph, compute_graph_scores, prune_graph
    from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig
    from safetensors.torch import load_file, save_file

    job = json.loads((folder / "job.json").read_text())
    A = load_file(folder / "adjacency.safetensors")["adjacency"].float()
    cfg = UnifiedConfig(n_layers=job["n_layers"], d_model=job["d_model"], d_head=1, n_heads=1,
                        d_mlp=1, d_vocab=job["n_vocab"], tokenizer_name="none", model_name="none",
                        original_architecture="glassgpt")  # fmt: skip
    n_f = len(job["features"])
    graph = Graph(
        input_string=job["prompt"], input_tokens=torch.tensor(job["tokens"]),
        active_features=torch.tensor(job["features"]).reshape(-1, 3), adjacency_matrix=A, cfg=cfg,
        selected_features=torch.arange(n_f), activation_values=torch.tensor(job["activations"]),
        logit_targets=[LogitTarget(token_str="", vocab_idx=i) for i in job["logit_ids"]],
        logit_probabilities=torch.tensor(job["logit_probs"]), scan="glassgpt",
        vocab_size=job["n_vocab"],
    )  # fmt: skip
    result = prune_graph(graph, job["node_threshold"], job["edge_threshold"])
    save_file({"node_mask": result.node_mask.contiguous(), "edge_mask": result.edge_mask.contiguous()},
              folder / "out.safetensors")  # fmt: skip
    replacement, completeness = compute_graph_scores(graph)

    doc = json.loads((folder / "graph.json").read_text())
    model = Model.model_validate(doc)
    mismatches = []
    n_layers = job["n_layers"]
    for node in model.nodes:
        layer, pos = node.layer, node.ctx_idx
        if node.feature_type == "cross layer transcoder":
            idx = int(node.node_id.split("_")[1])
            ref = Node.feature_node(int(layer), pos, idx, influence=node.influence, activation=node.activation)  # fmt: skip
        elif node.feature_type == "mlp reconstruction error":
            ref = Node.error_node(int(layer), pos, influence=node.influence)
        elif node.feature_type == "embedding":
            ref = Node.token_node(pos, int(node.node_id.split("_")[1]), influence=node.influence)
        else:
            token = node.clerp.split('"')[1]
            ref = Node.logit_node(pos, node.feature, token, n_layers, target_logit=node.is_target_logit, token_prob=node.token_prob)  # fmt: skip
        if ref.model_dump() != node.model_dump():
            mismatches.append([node.model_dump(), ref.model_dump()])
    out = {"replacement": replacement, "completeness": completeness,
           "nodes_checked": len(model.nodes), "mismatches": mismatches}  # fmt: skip
    (folder / "out.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
