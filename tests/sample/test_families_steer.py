"""``glassgpt steer`` and ``sample --steer`` on a tiny HF folder of each family, against
transformers: the vector is the difference of the means of the layer's hidden states
(``output_hidden_states``), and the steered greedy text is transformers' greedy continuation
with α·v added to that layer's output by a forward hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from tests.families import FAMILIES, family_folder, tokenizer  # noqa: E402

from glassgpt.cli import main  # noqa: E402

POSITIVE, NEGATIVE = ["the then the", "than the then"], ["in an in", "an in a tin"]
LAYER, ALPHA, PROMPT, NEW = 0, 6.0, "the cat", 10


def layer_mean(hf, text: str) -> torch.Tensor:
    """The mean over positions of the output of decoder layer LAYER (hidden_states[LAYER + 1])."""
    ids = torch.tensor([tokenizer().encode(text)])
    return hf(ids, output_hidden_states=True).hidden_states[LAYER + 1][0].double().mean(0)


def decoder_layers(hf) -> torch.nn.ModuleList:
    return hf.gpt_neox.layers if hasattr(hf, "gpt_neox") else hf.model.layers


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_steer_vector_and_steered_greedy_equal_transformers(family, tmp_path: Path, capsys) -> None:
    folder = family_folder(tmp_path / family, family)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    vec, hook = tmp_path / "v.safetensors", f"blocks.{LAYER}.resid_post"
    code = main(["steer", "-c", str(folder), "--positive", *POSITIVE, "--negative", *NEGATIVE,
                 "--hook", hook, "-o", str(vec)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    v = load_file(vec)["vector"]
    mean = lambda texts: torch.stack([layer_mean(hf, t) for t in texts]).mean(0)  # noqa: E731
    expected = mean(POSITIVE) - mean(NEGATIVE)
    assert expected.norm() > 0.5  # the prompts differ at this layer: a real check
    assert (v.double() - expected).abs().max() <= 1e-4 * expected.abs().max()

    def add(_module, _inputs, output):
        if isinstance(output, tuple):
            return (output[0] + ALPHA * v, *output[1:])
        return output + ALPHA * v

    ids = torch.tensor([tokenizer().encode(PROMPT)])
    plain = hf.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    handle = decoder_layers(hf)[LAYER].register_forward_hook(add)
    try:
        steered = hf.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    finally:
        handle.remove()
    assert not torch.equal(plain, steered)  # the steering changes the continuation
    capsys.readouterr()
    code = main(["sample", "-c", str(folder), "-p", PROMPT, "-m", str(NEW), "-t", "0",
                 "--no-stop-eos", "--steer", f"{vec}:{hook}:{ALPHA}"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    new = steered[0, ids.shape[1] :].tolist()
    assert out == PROMPT + tokenizer().decode_bytes(new).decode("utf-8", "replace") + "\n"
