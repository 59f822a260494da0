"""``glassgpt export --format gguf``: the file read back by ``gguf``'s own reader.

The oracles: transformers' weights of the same tiny models (``hf_cases``) under the rules of
llama.cpp's ``convert_hf_to_gguf.py`` (written out here: the names, the ``llama`` row
permutation, Gemma's 1 + w, NeoX's q | k | v regrouping), the names each architecture
declares in ``gguf.MODEL_TENSORS``, HF ``tokenizers`` built from the file's tokens and
merges, and, where ``llama_cpp`` imports, llama.cpp itself (greedy ids and logits).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.interop.hf_cases import CASES, make
from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.errors import ConfigError, GlassError
from glassgpt.interop import export_gguf, from_hf
from glassgpt.interop.gguf_export import LLAMA3_PATTERN, QWEN2_PATTERN
from glassgpt.interop.hf_tokenizers import save_tokenizer_json
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer, Tokenizer

gguf = pytest.importorskip("gguf")

END = "<|endoftext|>"
TEXT = "the cat sat on the mat; the dog sat on the log. 123 4567\n\n  indented  it's"
VOCAB = 300  # ≥ the byte-level tokenizer's 256 + merges + 1


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(TEXT * 4, 256 + 30, pattern="gpt2", special_tokens=[END])


def read(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the metadata by key, the tensors by name) of a GGUF file."""
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: t for t in r.tensors}


def values(t: Any) -> np.ndarray:
    """A read-back tensor as float64 [d_out, d_in] (dequantized)."""
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
        [int(n) for n in reversed(t.shape)]
    )


# -- the families, against transformers' weights -------------------------------------------

# the hf_cases that llama.cpp computes, made so where they are not (what it refuses is below)
FAMILIES = {
    "llama-gqa2-llama3-untied": ("llama", {}),
    "llama-gqa3-yarn-tied": ("llama", {}),
    "llama-mha-linear-wide-heads": ("llama", {}),
    "mistral-gqa4-window3": ("llama", {"sliding_window": 64}),  # ≥ n_ctx: the same function
    "qwen2-gqa2-tied": ("qwen2", {}),
    "qwen3-gqa2-untied": ("qwen3", {}),
    "qwen3-mha-yarn-tied": ("qwen3", {}),
    "gemma2-softcaps-window3": ("gemma2", {"query_pre_attn_scalar": 8}),
    "gemma3-local-base-linear-full": ("gemma3", {"query_pre_attn_scalar": 8}),
    "gemma3-softcaps-untied-all-sliding": ("gemma3", {"attn_logit_softcapping": None}),
    "neox-parallel-quarter-rotary": ("gptneox", {"hidden_act": "gelu_new"}),
    "neox-sequential-half-rotary-tied": ("gptneox", {}),
}


def hf_model(name: str) -> Any:
    case = CASES[name]
    return make(dataclasses.replace(
        case, kwargs={**case.kwargs, "vocab_size": VOCAB, **FAMILIES[name][1]}
    ))  # fmt: skip


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's ``LlamaModel.permute`` (rotate_half rows → interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def expected(hf: Any, arch: str) -> dict[str, np.ndarray]:
    """The converter's tensors of an HF model: name → float64 array [d_out, d_in]."""
    sd = {k: v.detach().double().numpy() for k, v in hf.state_dict().items()}
    c, out = hf.config, {}
    if arch == "gptneox":
        H, D = c.num_attention_heads, c.hidden_size
        top = {"gpt_neox.embed_in.weight": "token_embd.weight", "embed_out.weight": "output.weight",
               "lm_head.weight": "output.weight",  # transformers 5's name of embed_out
               "gpt_neox.final_layer_norm.weight": "output_norm.weight",
               "gpt_neox.final_layer_norm.bias": "output_norm.bias"}  # fmt: skip
        layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "attention.query_key_value": "attn_qkv", "attention.dense": "attn_output",
                 "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}  # fmt: skip
        for k, v in sd.items():
            if c.tie_word_embeddings and k in ("lm_head.weight", "embed_out.weight"):
                continue
            if "query_key_value" in k:  # per head q, k, v rows → all q | all k | all v
                v = v.reshape(H, 3, D // H, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)
            out[_name(k, top, layer, "gpt_neox.layers.")] = v
        if "output.weight" not in out:
            out["output.weight"] = sd["gpt_neox.embed_in.weight"]
        return out
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}  # fmt: skip
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "post_attention_layernorm": "post_attention_norm" if "gemma" in arch else "ffn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip
    for k, v in sd.items():
        if c.tie_word_embeddings and k == "lm_head.weight":
            continue
        if arch == "llama" and "q_proj" in k:
            v = permute(v, c.num_attention_heads)
        if arch == "llama" and "k_proj" in k:
            v = permute(v, c.num_key_value_heads)
        if "gemma" in arch and k.endswith("norm.weight"):
            v = v + 1
        out[_name(k, top, layer, "model.layers.")] = v
    return out


def _name(key: str, top: dict[str, str], layer: dict[str, str], prefix: str) -> str:
    if key in top:
        return top[key]
    l, rest = key.removeprefix(prefix).split(".", 1)
    part, suffix = rest.rsplit(".", 1)
    return f"blk.{l}.{layer[part]}.{suffix}"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_model_is_written_as_its_llama_cpp_architecture(
    name: str, tmp_path: Path, tok: Tokenizer
) -> None:
    arch = FAMILIES[name][0]
    hf = hf_model(name)
    ours = from_hf(hf)
    c = ours.config
    meta, tensors = read(export_gguf(ours, tok, tmp_path / "m.gguf"))
    assert meta["general.architecture"] == arch
    want = expected(hf, arch)
    if c.rope_scaling == "llama3":  # the converter's generate_extra_tensors
        want["rope_freqs.weight"] = _llama3_factors(hf.config)
    declared = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]}
    for n in tensors:
        base = n.rsplit(".", 1)[0].replace(".0.", ".{bid}.", 1)
        base = ".".join("{bid}" if p.isdecimal() else p for p in base.split("."))
        assert base in declared, f"{n} is not a tensor of llama.cpp's {arch}"
    assert sorted(tensors) == sorted(want)
    for n, w in want.items():
        got = values(tensors[n])
        assert got.shape == w.shape, n
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-6, err_msg=n)
        assert tensors[n].tensor_type == gguf.GGMLQuantizationType.F32
    k = f"{arch}."
    assert meta[k + "context_length"] == c.n_ctx and meta[k + "block_count"] == c.n_layers
    assert meta[k + "embedding_length"] == hf.config.hidden_size
    assert meta[k + "feed_forward_length"] == hf.config.intermediate_size
    assert meta[k + "attention.head_count"] == hf.config.num_attention_heads
    assert meta[k + "attention.head_count_kv"] == c.kv_heads
    assert meta[k + "rope.dimension_count"] == c.rotary_dims
    rope = hf.config.rope_parameters
    rope = rope.get("full_attention", rope)
    assert meta[k + "rope.freq_base"] == pytest.approx(rope["rope_theta"])
    if rope["rope_type"] in ("linear", "yarn"):
        assert meta[k + "rope.scaling.type"] == rope["rope_type"]
        assert meta[k + "rope.scaling.factor"] == pytest.approx(rope["factor"])
    eps = getattr(hf.config, "rms_norm_eps", None) or hf.config.layer_norm_eps
    eps_key = "layer_norm_epsilon" if arch == "gptneox" else "layer_norm_rms_epsilon"
    assert meta[k + "attention." + eps_key] == pytest.approx(eps)
    if arch == "gptneox":
        assert meta[k + "use_parallel_residual"] == hf.config.use_parallel_residual
    if "gemma" in arch:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = getattr(hf.config, key)
            assert (meta.get(k + key) is None) == (cap is None)
            assert cap is None or meta[k + key] == pytest.approx(cap)
        assert meta[k + "attention.sliding_window"] == hf.config.sliding_window
        kinds = [t == "sliding_attention" for t in hf.config.layer_types]
        assert list(meta[k + "attention.sliding_window_pattern"]) == kinds
    assert meta["general.file_type"] == gguf.LlamaFileType.ALL_F32


def _llama3_factors(hf_config: Any) -> np.ndarray:
    """The converter's rope_freqs of a llama3-scaled config (its formula, in float64)."""
    p = hf_config.rope_parameters
    dim = hf_config.head_dim
    freqs = 1.0 / (p["rope_theta"] ** (np.arange(0, dim, 2) / dim))
    lo, hi = p["original_max_position_embeddings"] / p["low_freq_factor"], p["original_max_position_embeddings"] / p["high_freq_factor"]  # fmt: skip
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < hi:
            out.append(1.0)
        elif wavelen > lo:
            out.append(p["factor"])
        else:
            s = (p["original_max_position_embeddings"] / wavelen - p["low_freq_factor"]) / (
                p["high_freq_factor"] - p["low_freq_factor"]
            )
            out.append(1 / ((1 - s) / p["factor"] + s))
    return np.array(out)


# -- a glassgpt run through the command: GPT-2 style, and the tokenizer --------------------


def gpt2_style(n_vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(n_vocab=n_vocab, n_ctx=16, d_model=32, n_layers=2, n_heads=4, mlp="gelu_tanh")
    )
    with torch.no_grad():
        for p in model.parameters():  # biases and gains not 0 and 1: each one is checked
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_the_command_writes_a_gpt2_run_and_its_tokenizer(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    model = gpt2_style(VOCAB)
    run = write_run(tmp_path / "run", model, tok)
    out = tmp_path / "out"
    assert main(["export", "-c", str(run), "--format", "gguf", "-o", str(out)]) == 0
    path = out / "model.gguf"
    assert capsys.readouterr().out.strip() == f"wrote {path}"
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf"]  # no temporary file left
    meta, tensors = read(path)
    assert meta["general.architecture"] == "gpt2"
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    D = model.config.d_model
    want = {"token_embd.weight": sd["embed.W_E"], "position_embd.weight": sd["pos_embed.W_P"],
            "output_norm.weight": sd["ln_final.w"], "output_norm.bias": sd["ln_final.b"]}  # fmt: skip
    for l in range(model.config.n_layers):
        p, b = f"blocks.{l}.", f"blk.{l}."
        want |= {
            b + "attn_norm.weight": sd[p + "ln1.w"], b + "attn_norm.bias": sd[p + "ln1.b"],
            b + "ffn_norm.weight": sd[p + "ln2.w"], b + "ffn_norm.bias": sd[p + "ln2.b"],
            b + "attn_qkv.weight": np.concatenate(  # each [H·d_head, D]
                [sd[p + f"attn.W_{m}"].transpose(0, 2, 1).reshape(D, D) for m in "QKV"]
            ),
            b + "attn_qkv.bias": np.concatenate([sd[p + f"attn.b_{m}"].reshape(-1) for m in "QKV"]),
            b + "attn_output.weight": sd[p + "attn.W_O"].reshape(D, D).T,
            b + "attn_output.bias": sd[p + "attn.b_O"],
            b + "ffn_up.weight": sd[p + "mlp.W_in"].T, b + "ffn_up.bias": sd[p + "mlp.b_in"],
            b + "ffn_down.weight": sd[p + "mlp.W_out"].T, b + "ffn_down.bias": sd[p + "mlp.b_out"],
        }  # fmt: skip
    assert sorted(tensors) == sorted(want)  # tied: no output.weight, llama.cpp reads token_embd
    for n, w in want.items():
        np.testing.assert_allclose(values(tensors[n]), w, rtol=0, atol=1e-6, err_msg=n)
    assert meta["gpt2.context_length"] == 16 and meta["gpt2.feed_forward_length"] == 4 * D
    assert meta["gpt2.attention.layer_norm_epsilon"] == pytest.approx(model.config.norm_eps)
    # the tokenizer: llama.cpp's gpt2 (byte-level BPE) model, its GPT-2 split
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == VOCAB
    end = tok.special_tokens[END]
    assert tokens[end] == END and types[end] == gguf.TokenType.CONTROL
    assert meta["tokenizer.ggml.bos_token_id"] == meta["tokenizer.ggml.eos_token_id"] == end
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert all(types[i] == gguf.TokenType.UNUSED for i in range(tok.n_vocab, VOCAB))
    assert all(types[i] == gguf.TokenType.NORMAL for i in range(len(tok.vocab)))
    hf_tok = _tokenizers_from(tokens[: len(tok.vocab)], meta["tokenizer.ggml.merges"])
    for text in (TEXT, "the mat's cat, 99 dogs!\n\n\tok", "héllo wörld 🙂"):
        assert hf_tok.encode(text).ids == tok.encode(text), text


def _tokenizers_from(tokens: list[str], merges: list[str]) -> Any:
    """HF ``tokenizers``' byte-level BPE of the file's tokens and merges (GPT-2's split)."""
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.models.BPE({t: i for i, t in enumerate(tokens)},
                                [tuple(m.split(" ")) for m in merges])  # fmt: skip
    out = tokenizers.Tokenizer(bpe)
    out.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return out


@pytest.mark.parametrize(
    ("dtype", "qtype", "atol"),
    [("f16", "F16", 1e-3), ("bf16", "BF16", 1e-2), ("q8_0", "Q8_0", 2e-2)],
)
def test_each_file_type_keeps_norms_in_f32_and_the_weights_close(
    dtype: str, qtype: str, atol: float, tmp_path: Path, tok: Tokenizer
) -> None:
    hf = hf_model("qwen3-gqa2-untied")  # d_model 32: Q8_0's rows of 32; d_mlp 48 is not
    model = from_hf(hf)
    meta, tensors = read(export_gguf(model, tok, tmp_path / "m.gguf", dtype=dtype))
    f32 = read(export_gguf(model, tok, tmp_path / "f.gguf"))[1]
    assert meta["general.file_type"] == getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}")
    Q = gguf.GGMLQuantizationType
    for n, t in tensors.items():
        if n.endswith("norm.weight"):
            assert t.tensor_type == Q.F32, n
        elif qtype == "Q8_0" and n.endswith("ffn_down.weight"):  # rows of 48: F16, as the converter
            assert t.tensor_type == Q.F16
        else:
            assert t.tensor_type == Q[qtype], n
        np.testing.assert_allclose(values(t), values(f32[n]), rtol=0, atol=atol, err_msg=n)


# -- refused, in one line, and nothing written ---------------------------------------------


@pytest.mark.parametrize(
    ("name", "field"),
    [("mistral-gqa4-window3", "sliding_window"), ("qwen2-window4-upper-layers", "sliding_window"),
     ("gemma2-untied-uncapped", "tie_embeddings"), ("gemma2-softcaps-window3", "attn_scale")],
)  # fmt: skip
def test_a_config_no_llama_cpp_architecture_computes_is_refused(
    name: str, field: str, tmp_path: Path, tok: Tokenizer
) -> None:
    case = CASES[name]
    model = from_hf(make(dataclasses.replace(case, kwargs={**case.kwargs, "vocab_size": VOCAB})))
    with pytest.raises(ConfigError, match=field) as err:
        export_gguf(model, tok, tmp_path / "m.gguf")
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_config_no_family_computes_is_refused_by_the_command(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    model = GPT(
        GPTConfig(n_vocab=VOCAB, n_ctx=8, d_model=16, n_layers=1, n_heads=2, norm="rmsnorm")
    )
    run = write_run(tmp_path / "run", model, tok)
    code = main(["export", "-c", str(run), "--format", "gguf", "-o", str(tmp_path / "m.gguf")])
    err = capsys.readouterr().err
    assert code != 0 and "norm" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()


def test_a_character_tokenizer_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chars = CharTokenizer(list("abc "), special_tokens=[END])
    model = GPT(GPTConfig(n_vocab=chars.n_vocab, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    run = write_run(tmp_path / "run", model, chars)
    code = main(["export", "-c", str(run), "--format", "gguf", "-o", str(tmp_path / "m.gguf")])
    err = capsys.readouterr().err
    assert code != 0 and "character tokenizer" in err and "Traceback" not in err
    assert not (tmp_path / "m.gguf").exists()


def test_a_tokenizer_without_a_llama_cpp_split_is_refused(tmp_path: Path) -> None:
    plain = Tokenizer.train(TEXT, 256 + 5, pattern=None, special_tokens=[END])
    with pytest.raises(GlassError, match="no split pattern"):
        export_gguf(gpt2_style(VOCAB), plain, tmp_path / "m.gguf")


# -- llama.cpp itself (llama-cpp-python), when it imports ----------------------------------


def llama_shaped(n_vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(n_vocab=n_vocab, n_ctx=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                       d_mlp=96, positional="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                       tie_embeddings=False)  # fmt: skip
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as err:  # the optional peer: built from source where the CPU allows
        pytest.skip(f"llama_cpp (llama-cpp-python) does not import: {err}")
    return llama_cpp


def run_in_llama_cpp(path: Path, ids: list[int], n_new: int) -> tuple[np.ndarray, list[int]]:
    """(llama.cpp's logits at each prompt position [T, V], its greedy continuation)."""
    llm = _llama_cpp().Llama(model_path=str(path), n_ctx=len(ids) + n_new, n_threads=1,
                             logits_all=True, verbose=False, type_k=0, type_v=0)  # fmt: skip
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    out: list[int] = []
    for _ in range(n_new):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return logits, out


def ours(model: GPT, ids: list[int], n_new: int) -> tuple[np.ndarray, list[int]]:
    """(glassgpt's logits at each prompt position, its greedy continuation)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].double().numpy()
        seq = list(ids)
        for _ in range(n_new):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return logits, seq[len(ids) :]


def agree(model: GPT, path: Path, ids: list[int], n_new: int) -> None:
    theirs_logits, theirs_ids = run_in_llama_cpp(path, ids, n_new)
    our_logits, our_ids = ours(model, ids, n_new)
    # float32 both; ggml's CPU GELU reads a float16 table, so a GELU model agrees less closely
    tol = 1e-3 if model.config.mlp_activations[0].startswith("gelu") else 1e-5
    scale = np.abs(our_logits).max()
    np.testing.assert_allclose(theirs_logits, our_logits, rtol=0, atol=tol * scale)
    assert theirs_ids == our_ids


@pytest.mark.parametrize("make_model", [gpt2_style, llama_shaped], ids=["gpt2", "llama"])
def test_llama_cpp_runs_an_exported_run_as_glassgpt_does(
    make_model: Any, tmp_path: Path, tok: Tokenizer
) -> None:
    _llama_cpp()
    model = make_model(VOCAB)
    path = export_gguf(model, tok, tmp_path / "m.gguf")
    agree(model, path, tok.encode("the cat sat on"), 6)


SPLITS = {"gpt2": "gpt2", "gpt4": "gpt4", "llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}
SAMPLES = [TEXT, "héllo wörld 🙂 it's 12345", "I'VE we'LL 3.14159 ÉCOLE über 日本語\r\n\n  x",
           "  leading\tand\r\n trailing", "Hello world's  1234!!\n\n"]  # fmt: skip


@pytest.mark.filterwarnings("ignore:tokenizer with a custom pattern")
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_llama_cpp_tokenizes_as_glassgpt_does(split: str, tmp_path: Path) -> None:
    llama_cpp = _llama_cpp()
    tok = Tokenizer.train(
        [TEXT * 4, *SAMPLES], 256 + 60, pattern=SPLITS[split], special_tokens=[END]
    )
    path = export_gguf(gpt2_style(400), tok, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in SAMPLES:  # the same split and merges
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_llama_cpp_runs_each_family_as_glassgpt_does(
    name: str, tmp_path: Path, tok: Tokenizer
) -> None:
    _llama_cpp()
    model = from_hf(hf_model(name))
    path = export_gguf(model, tok, tmp_path / "m.gguf")
    agree(model, path, [5, 17, 200, 33, 8], 4)


def test_a_gemma2_without_sliding_layers_gets_a_window_of_its_whole_context(
    tmp_path: Path, tok: Tokenizer
) -> None:
    windowed = from_hf(hf_model("gemma2-softcaps-window3"))
    c = dataclasses.replace(windowed.config, sliding_window=None, layer_types=None)
    model = GPT(c)
    model.load_state_dict(windowed.state_dict())
    model.eval()
    meta, _ = read(export_gguf(model, tok, tmp_path / "m.gguf"))
    # llama.cpp's gemma2 asserts a sliding layer; a window of n_ctx masks nothing in n_ctx
    assert meta["gemma2.attention.sliding_window"] == c.n_ctx
    assert list(meta["gemma2.attention.sliding_window_pattern"]) == [True] * c.n_layers
    ids = [5, 17, 200, 33, 8, 9, 10, 11]  # longer than the window of 3 it no longer has
    with torch.no_grad():
        assert not torch.allclose(model(torch.tensor([ids])), windowed(torch.tensor([ids])))
    _llama_cpp()
    agree(model, tmp_path / "m.gguf", ids, 4)


def test_a_tokenizer_without_merges_is_refused(tmp_path: Path) -> None:
    bytes_only = Tokenizer([bytes([b]) for b in range(256)], {}, special_tokens=[END])
    with pytest.raises(GlassError, match="no merges"):
        export_gguf(gpt2_style(VOCAB), bytes_only, tmp_path / "m.gguf")


def test_an_hf_folder_with_its_tokenizer_json_goes_to_llama_cpp_through_the_command(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = hf_model("qwen3-gqa2-untied")
    hf.save_pretrained(tmp_path / "hf")
    save_tokenizer_json(tok, tmp_path / "hf" / "tokenizer.json")  # a ByteLevel BPE file
    out = tmp_path / "qwen3.gguf"
    assert main(["export", "-c", str(tmp_path / "hf"), "--format", "gguf", "-o", str(out)]) == 0
    meta, _ = read(out)
    assert meta["general.architecture"] == "qwen3" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"][tok.special_tokens[END]] == END
    _llama_cpp()
    agree(from_hf(hf), out, tok.encode("the cat sat"), 4)
