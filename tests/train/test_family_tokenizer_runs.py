"""A run fine-tuned from an HF folder with a model family's own tokenizer keeps that
tokenizer's ``tokenizer_config.json`` (its chat template, BOS/EOS strings) and
``generation_config.json`` (the ids that end a generation) in every checkpoint, through
``--resume`` too: ``open_run`` on the run has the source's template and end ids, ``serve``
chats with them (the official ``openai`` client; the reply is transformers' greedy
continuation of ``apply_chat_template``'s ids on the ``export --format hf`` of the run,
stopped by its ``generation_config.json``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop.hf_cases import CASES, Case, make
from tests.serve.conftest import start_server
from tests.tokenizer.family_files import LLAMA3_TEMPLATE, write_family

from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.serve.app import create_app
from glassgpt.tokenizer import FamilyTokenizer

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

MESSAGES = [{"role": "user", "content": "Hello world, the quick fox"}]
SETS = ["train.progress=false", "train.threads=1", "train.batch_size=2", "train.max_steps=2",
        "train.eval_every=2", "train.eval_batches=1", "train.checkpoint_every=1",
        "train.sample_tokens=0", "train.warmup_steps=1", "train.precision=fp32",
        "model.dropout=0.0", "data.val_fraction=0.1"]  # fmt: skip


def llama_folder(out: Path) -> tuple[Path, list[int]]:
    """A tiny Llama with a Llama 3-style tokenizer and chat template; its end ids: <|eot_id|>
    and every third ordinary id (so that a random model's greedy reply ends soon)."""
    write_family("llama3", out)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    base = CASES["llama-gqa2-llama3-untied"]
    kwargs = {**base.kwargs, "vocab_size": len(hf_tok), "max_position_embeddings": 64}
    make(Case(base.config, base.model, kwargs)).save_pretrained(out)
    eos = [hf_tok.convert_tokens_to_ids("<|eot_id|>"), *range(40, 250, 3)]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out, eos


def text_file(folder: Path) -> Path:
    rng = random.Random(0)
    words = ["the", "quick", "fox", "hello", "world", "café", "naïve", "dog", "lazy", "over"]
    path = folder / "text.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(1500)) + "\n")
    return path


def test_a_finetuned_run_keeps_the_template_and_end_ids(tmp_path: Path) -> None:
    source, eos = llama_folder(tmp_path / "llama")
    run = tmp_path / "run"
    data = text_file(tmp_path)
    argv = ["train", "--init-from", str(source), "--data", str(data), "-o", str(run), "--set"]
    assert main([*argv, *SETS, "train.max_steps=1"]) == 0
    assert main(["train", "--resume", str(run), "--set", *SETS]) == 0  # from step 1's files
    found = open_run(run)
    assert found.step == 2
    meta = json.loads((run / "data" / "meta.json").read_text())  # bos ‖ doc ‖ <|end_of_text|>
    vocab = found.tokenizer.backend.get_vocab()
    assert meta["separator"]["prefix_ids"] == [vocab["<|begin_of_text|>"]]
    assert meta["separator"]["ids"] == [vocab["<|end_of_text|>"]]
    assert isinstance(found.tokenizer, FamilyTokenizer)
    assert found.tokenizer.eos_ids == open_run(source, weights=False).tokenizer.eos_ids
    assert set(found.tokenizer.eos_ids) == set(eos)
    assert found.chat_template is not None and found.chat_template.source == LLAMA3_TEMPLATE
    assert found.chat_template.variables["bos_token"] == "<|begin_of_text|>"
    for step in (1, 2):  # each checkpoint holds them
        folder = run / "ckpt" / f"step_{step:06d}"
        assert (folder / "tokenizer_config.json").read_bytes() == (
            source / "tokenizer_config.json"
        ).read_bytes()
        assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == eos

    hf_out = tmp_path / "hf"
    assert main(["export", "-c", str(run), "--format", "hf", "-o", str(hf_out)]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_out, torch_dtype=torch.float32)
    prompt = hf_tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    with torch.no_grad():  # stops at the exported generation_config.json's end ids
        x = torch.tensor([prompt])  # the mask given: id 0 in a prompt is no padding
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12,
                          do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    assert out[-1] in eos and len(out) < 12  # the reply ended at an end id
    want = hf_tok.decode(out[:-1])

    torch.set_num_threads(1)
    app = create_app(found.model, found.tokenizer, name="ft", slots=2, chat=found.chat_template)
    srv, thread, url = start_server(app)
    try:
        client: Any = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="ft", messages=MESSAGES, max_tokens=12,
                                           temperature=0)  # fmt: skip
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len(out) - 1
    assert r.choices[0].message.content == want
