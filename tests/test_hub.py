"""Hub ids (``hf:ORG/NAME[@REVISION]``) in ``open_run``, ``glassgpt.load`` and ``-c``, with the
network off: a hub cache laid out in ``tmp_path`` as huggingface_hub writes it (blobs named by
their hash, snapshot entries as relative symlinks to them, refs naming commits), holding a tiny
GPT-2 on ``main`` and a tiny Llama on the tag ``step2``; each loads with the logits of the
transformers model saved, and ``sample`` decodes it greedily as transformers does."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

import glassgpt
from glassgpt.checkpoint.hub import parse_hub_id
from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.interop.hf_tokenizers import save_tokenizer_json
from glassgpt.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

REPO = "tiny-org/tiny-lm"
MAIN, STEP2 = "a" * 40, "b" * 40  # the commits of main and of the tag step2
V = 262  # 256 bytes and the merges below


def tokenizer() -> Tokenizer:
    return Tokenizer.from_merges([(b"a", b"b"), (b"c", b"d"), (b"ab", b"cd"), (b" ", b"a")])


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> torch.nn.Module:
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def blob_name(path: Path) -> str:
    """The name huggingface_hub gives a file's blob: its ETag, the sha256 of an LFS file (the
    weights) or the git blob sha1 of a plain one (the JSON files)."""
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_snapshot(cache: Path, repo: str, commit: str, folder: Path, refs: list[str]) -> None:
    """The files of ``folder`` as the snapshot ``commit`` of ``repo`` in the hub cache ``cache``."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        blob = storage / "blobs" / blob_name(file)
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {"main": gpt2(), "step2": llama()}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models) -> Path:
    """A hub cache with REPO at main (GPT-2) and step2 (Llama), the network off."""
    cache = tmp_path / "home" / "hub"
    for name, commit in (("main", MAIN), ("step2", STEP2)):
        saved = tmp_path / "saved" / name
        models[name].save_pretrained(saved)
        save_tokenizer_json(tokenizer(), saved / "tokenizer.json")
        add_snapshot(cache, REPO, commit, saved, [name])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))  # glassgpt reads it when an id opens
    return cache


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
@pytest.mark.parametrize(
    ("spec", "which"),
    [
        (f"hf:{REPO}", "main"),
        (f"hf:{REPO}@main", "main"),
        (f"hf:{REPO}@step2", "step2"),  # a tag: refs/step2
        (f"hf:{REPO}@{STEP2}", "step2"),  # a commit: its snapshot folder
    ],
)
def test_a_hub_id_loads_the_snapshot_of_its_revision(cache, models, spec, which) -> None:
    model, tok = glassgpt.load(spec)
    x = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(3))
    expected = models[which](x).logits
    assert expected.abs().max() > 0.01  # random weights, not zeros: a real check
    assert (logits(model, x) - expected).abs().max() <= 1e-5
    assert tok.encode("abcd a") == tokenizer().encode("abcd a")
    other = models["step2" if which == "main" else "main"](x).logits
    assert (logits(model, x) - other).abs().max() > 1e-3  # the revision chose these weights


@torch.no_grad()
def test_hf_hub_cache_names_the_cache_too(cache, models, monkeypatch, tmp_path) -> None:
    moved = tmp_path / "elsewhere"
    cache.rename(moved)
    monkeypatch.setenv("HF_HUB_CACHE", str(moved))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    run = glassgpt.checkpoint.open_run(f"hf:{REPO}@step2")
    assert run.kind == "hf" and run.source == moved / f"models--{REPO.replace('/', '--')}" / (
        "snapshots/" + STEP2
    )
    assert run.model_config.n_kv_heads == 2  # the Llama, as the Llama family imports it


@torch.no_grad()
def test_sample_command_decodes_a_hub_model_as_transformers_does(cache, models, capsys) -> None:
    tok = tokenizer()
    prompt = "abcd a"
    ids = torch.tensor([tok.encode(prompt)])
    greedy = models["main"].generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    code = main(["sample", "-c", f"hf:{REPO}", "-p", prompt, "-m", "6", "-t", "0",
                 "--no-stop-eos"])  # fmt: skip
    assert code in (0, None)
    out = capsys.readouterr().out
    assert tok.decode(greedy[0].tolist()) in out


def test_an_id_not_in_the_cache_is_one_line(cache, capsys) -> None:
    with pytest.raises(GlassError) as info:
        glassgpt.load("hf:EleutherAI/pythia-160m@step3000")
    message = str(info.value)
    assert "\n" not in message
    assert "hf:EleutherAI/pythia-160m@step3000" in message and str(cache) in message
    assert "hf download EleutherAI/pythia-160m --revision step3000" in message
    assert "HF_HUB_OFFLINE" in message
    with pytest.raises(GlassError, match=r"hf download tiny-org/tiny-lm --revision nope`"):
        glassgpt.load(f"hf:{REPO}@nope")  # the repo is there, not this revision
    code = main(["sample", "-c", "hf:EleutherAI/pythia-160m", "-p", "a"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "hf download EleutherAI/pythia-160m`" in err


def test_a_snapshot_without_weights_is_not_a_model(cache, tmp_path) -> None:
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"model_type": "gpt2"}')
    add_snapshot(cache, "tiny-org/config-only", "c" * 40, config_only, ["main"])
    with pytest.raises(GlassError, match=r"incomplete in the Hugging Face cache"):
        glassgpt.load("hf:tiny-org/config-only")


def test_the_hub_cannot_be_reached_is_one_line(cache, monkeypatch) -> None:
    """Downloads on, the hub a closed local port: the real connection error, as one line."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(GlassError) as info:
        glassgpt.load("hf:tiny-org/absent@v1")
    message = str(info.value)
    assert "\n" not in message and "could not be reached" in message
    assert str(cache) in message and "hf download tiny-org/absent --revision v1" in message


@pytest.mark.parametrize(
    "spec", ["hf:", "hf:tiny org/x", "hf:a/b/c", "hf:a--b/c", "hf:a/b@", "hf:a/b@x y"]
)
def test_a_malformed_id_is_one_line(cache, spec, capsys) -> None:
    with pytest.raises(GlassError, match=r"not a hub id; expected hf:ORG/NAME") as info:
        glassgpt.load(spec)
    assert "\n" not in str(info.value)
    assert main(["describe", "-c", spec]) != 0
    assert "not a hub id" in capsys.readouterr().err


def test_the_parts_of_an_id() -> None:
    assert parse_hub_id("hf:gpt2").repo == "gpt2"
    assert parse_hub_id("hf:org/x@refs/pr/1").revision == "refs/pr/1"
    assert str(parse_hub_id("hf:org/x@v1")) == "hf:org/x@v1"
