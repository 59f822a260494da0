"""Loading an HF folder costs the model's memory once: each tensor is memory-mapped, copied
into its parameter and unmapped before the next (``interop/hf_files.py``), so the peak
resident memory of ``from_hf`` grows by the model's bytes plus about one tensor, not by the
file and the model side by side. Measured in a fresh process (its peak reset by
``/proc/self/clear_refs`` after the imports) on a 128 MB Llama-shaped model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glassgpt.interop import to_hf
from glassgpt.model import GPT, GPTConfig

SRC = Path(__file__).resolve().parents[2] / "src"
CHILD = """
import json, sys, torch
from glassgpt.interop import from_hf
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
dtype = getattr(torch, sys.argv[3])
from_hf(sys.argv[2], dtype=dtype)  # a tiny one first: the code's own pages are then resident
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
model = from_hf(sys.argv[1], dtype=dtype)
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"peak": status("VmHWM:") - base, "model": weights}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_peak_memory_of_a_load_is_the_model_and_about_one_tensor(
    dtype: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder, tiny = (tmp_path_factory.getbasetemp() / name for name in ("llama-128mb", "tiny"))
    if not folder.exists():
        config = GPTConfig(n_vocab=8000, n_ctx=64, d_model=512, n_layers=8, n_heads=8,
                           n_kv_heads=2, d_mlp=1536, positional="rope", norm="rmsnorm",
                           mlp="swiglu", bias=False, tie_embeddings=False)  # fmt: skip
        to_hf(GPT(config), folder)
        to_hf(GPT(config.replace(n_vocab=10, d_model=8, n_heads=2, n_kv_heads=1, d_mlp=8)), tiny)
    size = (folder / "model.safetensors").stat().st_size
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(tiny), dtype], env=env,
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["model"] == pytest.approx(size * (1 if dtype == "float32" else 0.5), abs=2**16)
    largest = 8000 * 512 * 4  # W_E or W_U in float32: the largest tensor read at once
    print(f"{dtype}: model {got['model'] / 2**20:.0f} MiB, peak {got['peak'] / 2**20:.0f} MiB")
    assert got["peak"] <= got["model"] + 1.5 * largest, got  # not file + model (2×)
