"""The circuit-tracer side of tests/serve/test_graph_circuit_tracer.py, run by an interpreter that
has circuit_tracer (its own venv). Imports nothing from glassgpt; talks through files.

    python circuit_tracer_files_side.py DIR    reads DIR/job.json and DIR/adjacency.safetensors,
      builds circuit-tracer's Graph of that adjacency and writes its graph file with its own
      create_graph_files → DIR/out/{slug}.json

create_graph_files names the prompt's tokens with an HF tokenizer loaded by name; there is no
network here, so the job's vocabulary (the served model's token texts) stands in for it.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


class Vocabulary:
    """What create_graph_files asks of a tokenizer: decode(id)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def decode(self, token: object) -> str:
        return self.texts[int(token)]  # type: ignore[call-overload]


def main(folder: Path) -> None:
    import torch
    from circuit_tracer.attribution.targets import LogitTarget
    from circuit_tracer.graph import Graph
    from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig
    from safetensors.torch import load_file

    module = importlib.import_module("circuit_tracer.utils.create_graph_files")
    job = json.loads((folder / "job.json").read_text())
    vocab = Vocabulary(job["vocab"])
    module.AutoTokenizer = type(
        "Offline", (), {"from_pretrained": staticmethod(lambda name: vocab)}
    )
    cfg = UnifiedConfig(n_layers=job["n_layers"], d_model=job["d_model"], d_head=1, n_heads=1,
                        d_mlp=1, d_vocab=job["n_vocab"], tokenizer_name="offline",
                        model_name="glassgpt", original_architecture="glassgpt")  # fmt: skip
    n_f = len(job["features"])
    graph = Graph(
        input_string=job["prompt"], input_tokens=torch.tensor(job["tokens"]),
        active_features=torch.tensor(job["features"]).reshape(-1, 3),
        adjacency_matrix=load_file(folder / "adjacency.safetensors")["adjacency"].float(), cfg=cfg,
        selected_features=torch.arange(n_f), activation_values=torch.tensor(job["activations"]),
        logit_targets=[LogitTarget(token_str=vocab.decode(i), vocab_idx=i) for i in job["logit_ids"]],
        logit_probabilities=torch.tensor(job["logit_probs"]), scan="glassgpt-test",
        vocab_size=job["n_vocab"],
    )  # fmt: skip
    module.create_graph_files(
        graph, "theirs", folder / "out", node_threshold=1.0, edge_threshold=1.0
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
