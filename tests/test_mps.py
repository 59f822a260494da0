"""``--device mps``: the model, ``sample``, ``train`` and the server's loading on Apple's Metal
backend (marked ``mps``: they run where this torch has it, and skip elsewhere); and, on every
machine, a device it does not have is refused with the list of those it has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassgpt.devices import available_devices, parse_device
from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT, GPTConfig
from glassgpt.train.distributed import resolve_device

HAS_MPS = "mps" in available_devices()


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_vocab=33, n_ctx=32, d_model=16, n_layers=2, n_heads=2)).eval()


def test_a_device_this_machine_lacks_is_refused_naming_those_it_has() -> None:
    have = available_devices()
    assert have[0] == "cpu"
    for name in ("mps", "cuda", "cuda:7", "xpu", "gpu"):
        if name in have:
            continue
        with pytest.raises(GlassError) as info:
            parse_device(name)
        assert (
            str(info.value)
            == f"--device {name}: not usable here; this machine has {', '.join(have)}"
        )
    assert parse_device("cpu") == torch.device("cpu")
    if not HAS_MPS:
        with pytest.raises(ConfigError, match=f"this machine has {', '.join(have)}"):
            resolve_device("mps")


@pytest.mark.mps
@pytest.mark.skipif(not HAS_MPS, reason="no MPS device here")
def test_the_model_and_generate_on_mps_compute_the_cpu_function() -> None:
    from glassgpt.sample import generate

    model = tiny()
    tokens = torch.randint(0, 33, (2, 12), generator=torch.Generator().manual_seed(1))
    on = tiny().to(parse_device("mps"))
    with torch.inference_mode():
        assert torch.allclose(on(tokens.to("mps")).cpu(), model(tokens), atol=1e-4)
    assert generate(on, [1, 2, 3], max_new_tokens=8, temperature=0) == generate(
        model, [1, 2, 3], max_new_tokens=8, temperature=0
    )
    assert resolve_device("mps") == torch.device("mps")


@pytest.mark.mps
@pytest.mark.skipif(not HAS_MPS, reason="no MPS device here")
def test_sample_and_train_run_on_mps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.sample.conftest import write_run

    from glassgpt.cli import main
    from glassgpt.tokenizer import CharTokenizer

    run = write_run(
        tmp_path / "run", tiny(), CharTokenizer(list("abcdefghijklmnopqrstuvwxyz ,.!?\n"))
    )
    assert main(["sample", "-c", str(run), "--device", "mps", "--prompt", "ab",
                 "--max-new-tokens", "5", "--temperature", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("ab")
    text = tmp_path / "text.txt"
    text.write_text("hello world, hello mps. " * 200)
    assert main(["train", "--preset", "cpu-tiny", "--data", str(text), "-o", str(tmp_path / "t"),
                 "--set", "train.device=mps", "train.max_steps=3", "--no-progress"]) == 0  # fmt: skip
