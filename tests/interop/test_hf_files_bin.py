"""Folders of ``pytorch_model-0000k-of-0000n.bin`` shards and ``pytorch_model.bin.index.json``
(what transformers 4 wrote with ``safe_serialization=False``; transformers 5 writes
safetensors only, so the shards here are written by ``huggingface_hub.save_torch_state_dict``,
the writer transformers 4 called) load as the safetensors folders do: the same weights,
transformers itself loading the same folder as the oracle, a bad tensor named in one line,
and the peak memory of the model plus about one tensor.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.interop.hf_cases import CASES, make, tokens
from tests.interop.test_hf_bad_input import WEIGHTS  # the change and its one line

from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.errors import InputFileError
from glassgpt.interop import from_hf, to_hf
from glassgpt.model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
hub = pytest.importorskip("huggingface_hub")

SRC = Path(__file__).resolve().parents[2] / "src"
BIN_INDEX = "pytorch_model.bin.index.json"


def write_bin_shards(
    state: dict[str, torch.Tensor], config: Any, folder: Path, shard: str = "20KB"
) -> Path:
    """``config.json`` and the state dict in ``.bin`` shards of at most ``shard`` each."""
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    hub.save_torch_state_dict(
        {k: v.contiguous() for k, v in state.items()}, folder, safe_serialization=False,
        max_shard_size=shard,
    )  # fmt: skip
    return folder


@pytest.mark.parametrize("case", ["llama-gqa2-llama3-untied", "neox-parallel-quarter-rotary"])
def test_a_sharded_bin_folder_loads_the_same_weights(case: str, tmp_path: Path) -> None:
    hf = make(CASES[case])
    folder = write_bin_shards(hf.state_dict(), hf.config, tmp_path / "bin")
    shards = sorted(p.name for p in folder.glob("pytorch_model-*.bin"))
    assert len(shards) >= 3 and not list(folder.glob("*.safetensors")), shards
    assert (folder / BIN_INDEX).is_file()
    ours, reference = from_hf(folder), from_hf(hf)  # the folder, and the model object itself
    mine, want = ours.state_dict(), reference.state_dict()
    assert mine.keys() == want.keys()
    for name in want:
        assert torch.equal(mine[name], want[name]), name
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()  # the oracle
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, rtol=1e-5, atol=1e-5)
    run = open_run(folder)  # -c and glassgpt.load see an HF folder too
    assert run.model is not None and torch.equal(run.model(x), ours(x))


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_a_bad_tensor_in_a_bin_shard_is_named_in_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = make(CASES["llama-gqa2-llama3-untied"])
    state = dict(hf.state_dict())
    change, message = WEIGHTS[name]
    change(state)
    folder = write_bin_shards(state, hf.config, tmp_path / "bad")
    with pytest.raises(InputFileError, match=message) as info:
        from_hf(folder)
    assert "\n" not in str(info.value)
    assert main(["sample", "-c", str(folder), "--prompt", "x", "--max-new-tokens", "1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glassgpt: error: ") and re.search(message, err[0])


def test_an_index_that_names_a_tensor_its_shard_lacks_is_named(tmp_path: Path) -> None:
    hf = make(CASES["llama-gqa2-llama3-untied"])
    folder = write_bin_shards(hf.state_dict(), hf.config, tmp_path / "bin")
    index = json.loads((folder / BIN_INDEX).read_text())
    name = "model.layers.1.mlp.up_proj.weight"
    elsewhere = next(s for s in set(index["weight_map"].values()) if s != index["weight_map"][name])
    index["weight_map"][name] = elsewhere
    (folder / BIN_INDEX).write_text(json.dumps(index))
    with pytest.raises(InputFileError, match=rf"{elsewhere}: missing tensor {name} \(its index"):
        from_hf(folder)


CHILD = """
import json, sys, torch
from glassgpt.interop import from_hf
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
from_hf(sys.argv[2])  # a tiny one first: the code's own pages are then resident
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
model = from_hf(sys.argv[1])
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"peak": status("VmHWM:") - base, "model": weights}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_the_peak_memory_of_a_bin_load_is_the_model_and_about_one_tensor(
    layout: str, tmp_path: Path
) -> None:
    config = GPTConfig(n_vocab=4000, n_ctx=64, d_model=512, n_layers=4, n_heads=8, n_kv_heads=2,
                       d_mlp=1536, positional="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                       tie_embeddings=False)  # fmt: skip
    to_hf(GPT(config), tmp_path / "st")  # ≈ 50 MB in float32
    state = load_file(tmp_path / "st" / "model.safetensors")
    folder, tiny = tmp_path / "bin", tmp_path / "tiny"
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path / "st")
    if layout == "single":
        folder.mkdir()
        hf_config.save_pretrained(folder)
        torch.save({k: v.contiguous() for k, v in state.items()}, folder / "pytorch_model.bin")
    else:
        write_bin_shards(state, hf_config, folder, shard="12MB")
    del state
    to_hf(GPT(config.replace(n_vocab=10, d_model=8, n_heads=2, n_kv_heads=1, d_mlp=8)), tiny)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(tiny)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    largest = 4000 * 512 * 4  # W_E or W_U: the largest tensor read at once
    print(f"{layout}: model {got['model'] / 2**20:.0f} MiB, peak {got['peak'] / 2**20:.0f} MiB")
    assert got["peak"] <= got["model"] + 1.5 * largest, got  # not file + model (2×)
