"""HF GPT-2 interop against transformers itself: random GPT2LMHeadModels of several shapes
load into GPT with equal logits and loss, and our exports load back into transformers."""

from __future__ import annotations

import json

import pytest
import torch

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.interop import from_hf, to_hf
from glassgpt.interop.hf_gpt2 import config_from_hf
from glassgpt.model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SHAPES = {  # vocab, n_ctx, d, layers, heads, n_inner, activation, tied, extra
    "tied-gelu_new": (50, 16, 24, 2, 3, None, "gelu_new", True, {}),
    "untied-gelu-inner": (97, 32, 32, 3, 4, 48, "gelu", False, {}),
    "one-head-relu": (61, 8, 16, 1, 1, None, "relu", True, {}),
    "untied-upcast": (128, 24, 48, 2, 6, 100, "gelu_pytorch_tanh", False,
                      {"reorder_and_upcast_attn": True, "layer_norm_epsilon": 1e-6}),
}  # fmt: skip


def _hf_config(vocab, n_ctx, d, layers, heads, n_inner, act, tied, extra):
    return transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=n_ctx,
        n_embd=d,
        n_layer=layers,
        n_head=heads,
        n_inner=n_inner,
        activation_function=act,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=None,
        **extra,
    )


def _random_hf(shape: tuple, seed: int = 0):
    """A GPT2LMHeadModel with every parameter random (norm weights near 1, biases nonzero)."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(_hf_config(*shape)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def _tokens(vocab: int, n_ctx: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (3, n_ctx), generator=torch.Generator().manual_seed(seed))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.fixture(params=list(SHAPES), scope="module")
def shape(request) -> tuple:
    return SHAPES[request.param]


@pytest.fixture(scope="module")
def hf_model(shape):
    return _random_hf(shape)


@torch.no_grad()
def test_model_object_loads_with_equal_logits_and_loss(shape, hf_model) -> None:
    model = from_hf(hf_model)
    x = _tokens(shape[0], shape[1])
    expected = hf_model(x).logits
    assert expected.abs().max() > 1.0  # the weights are far from init: a real check
    assert _max_diff(model(x), expected) <= 1e-5
    # HF shifts its labels; our targets are the next tokens
    _, loss = model(x[:, :-1], targets=x[:, 1:])
    assert abs(float(loss) - float(hf_model(x, labels=x).loss)) <= 1e-5
    assert model.config.tie_embeddings == shape[7]
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in hf_model.parameters()
    )  # no unembedding bias, as GPT-2


@torch.no_grad()
def test_state_dict_and_saved_folder_load_the_same(shape, hf_model, tmp_path) -> None:
    x = _tokens(shape[0], shape[1], seed=2)
    expected = hf_model(x).logits
    from_state = from_hf(hf_model.state_dict(), config=hf_model.config.to_dict())
    assert _max_diff(from_state(x), expected) <= 1e-5
    hf_model.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert _max_diff(from_hf(tmp_path / "hf")(x), expected) <= 1e-5


@torch.no_grad()
def test_export_reloads_in_transformers_with_equal_logits(shape, hf_model, tmp_path) -> None:
    model = from_hf(hf_model)
    to_hf(model, tmp_path / "out")
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    x = _tokens(shape[0], shape[1], seed=3)
    assert _max_diff(reloaded(x).logits, model(x)) <= 1e-5
    assert reloaded.config.tie_word_embeddings == model.config.tie_embeddings
    again = from_hf(tmp_path / "out")
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


@torch.no_grad()
def test_export_of_a_fresh_gpt_without_biases(tmp_path) -> None:
    torch.manual_seed(0)
    config = GPTConfig(n_vocab=40, n_ctx=12, d_model=16, n_layers=2, n_heads=2, bias=False,
                       mlp="gelu", tie_embeddings=False, init_std=0.3)  # fmt: skip
    model = GPT(config).eval()
    to_hf(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    x = _tokens(40, 12)
    assert _max_diff(hf(x).logits, model(x)) <= 1e-5
    assert hf.config.activation_function == "gelu" and hf.config.n_inner == 64


@torch.no_grad()
def test_sharded_safetensors_and_weights_only_bin(tmp_path) -> None:
    hf = _random_hf(SHAPES["tied-gelu_new"])
    x = _tokens(50, 16)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert _max_diff(from_hf(tmp_path / "sharded")(x), hf(x).logits) <= 1e-5
    (tmp_path / "bin").mkdir()
    hf.config.to_json_file(tmp_path / "bin" / "config.json")
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert _max_diff(from_hf(tmp_path / "bin")(x), hf(x).logits) <= 1e-5


class _NotWeights:
    def __reduce__(self):
        return (print, ("a pickle that runs code",))


def test_pickled_code_is_refused(tmp_path) -> None:
    hf = _random_hf(SHAPES["one-head-relu"])
    hf.config.to_json_file(tmp_path / "config.json")
    torch.save({"wte.weight": _NotWeights()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InputFileError, match="unreadable weights"):
        from_hf(tmp_path)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({"add_cross_attention": True}, "add_cross_attention"),
        ({"scale_attn_weights": False}, "scale_attn_weights"),
        ({"activation_function": "quick_gelu"}, "activation_function"),
        ({"model_type": "gpt_neo"}, "model_type"),
        ({"attn_pdrop": 0.0}, "resid_pdrop"),
        ({"n_head": 5}, "n_heads"),
    ],
)
def test_unrepresentable_hf_configs_name_the_field(change, field) -> None:
    d = _hf_config(*SHAPES["tied-gelu_new"]).to_dict()
    with pytest.raises(ConfigError) as info:
        config_from_hf({**d, **change})
    assert info.value.field == field


def test_one_dropout_may_be_given_for_three() -> None:
    d = {**_hf_config(*SHAPES["tied-gelu_new"]).to_dict(), "attn_pdrop": 0.0}
    assert config_from_hf(d, dropout=0.05).dropout == 0.05


def test_tied_model_with_vocab_mismatch_names_n_vocab() -> None:
    hf = _random_hf(SHAPES["tied-gelu_new"])
    state = dict(hf.state_dict())
    state["lm_head.weight"] = torch.randn(49, 24)  # tied config, but a head of another vocabulary
    with pytest.raises(ConfigError) as info:
        from_hf(state, config=hf.config)
    assert info.value.field == "n_vocab"
    config = {**hf.config.to_dict(), "vocab_size": 51}  # the config disagrees with wte
    with pytest.raises(ConfigError) as info:
        from_hf(hf.state_dict(), config=config)
    assert info.value.field == "n_vocab"


def test_tied_config_with_different_head_is_refused() -> None:
    hf = _random_hf(SHAPES["tied-gelu_new"])
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] += 1.0
    with pytest.raises(ConfigError, match=r"^tie_word_embeddings: "):
        from_hf(state, config=hf.config)


def test_missing_and_unexpected_keys_are_named(tmp_path) -> None:
    hf = _random_hf(SHAPES["one-head-relu"])
    state = dict(hf.state_dict())
    del state["transformer.h.0.mlp.c_fc.bias"]
    with pytest.raises(InputFileError, match=r"missing h\.0\.mlp\.c_fc\.bias"):
        from_hf(state, config=hf.config)
    state = {**hf.state_dict(), "multiple_choice_head.summary.weight": torch.zeros(1)}
    with pytest.raises(InputFileError, match="unexpected key multiple_choice_head"):
        from_hf(state, config=hf.config)
    with pytest.raises(ConfigError, match=r"^config: "):
        from_hf(hf.state_dict())


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "not a folder"),
        (lambda p: p.mkdir(), "config.json: not found"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text("{oops")), "unreadable config"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text("{}")), "no model.safetensors"),
        (
            lambda p: (
                p.mkdir(),
                (p / "config.json").write_text("{}"),
                (p / "model.safetensors").write_bytes(b"\x08garbage"),
            ),
            "unreadable weights",
        ),
    ],
)
def test_bad_folders_are_one_line_input_errors(tmp_path, setup, message) -> None:
    folder = tmp_path / "model"
    setup(folder)
    with pytest.raises(InputFileError, match=message):
        from_hf(folder)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"positional": "sinusoidal"}, "positional"),  # (rope with these: a GPT-NeoX)
        ({"norm": "rmsnorm"}, "norm"),
        ({"norm_placement": "post"}, "norm_placement"),
        ({"mlp": "swiglu"}, "mlp"),
        ({"d_head": 4}, "d_head"),
    ],
)
def test_export_refuses_what_gpt2_cannot_hold(change, field, tmp_path) -> None:
    config = GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=1, n_heads=2, **change)
    with pytest.raises(ConfigError) as info:
        to_hf(GPT(config), tmp_path)
    assert info.value.field == field
    assert not (tmp_path / "model.safetensors").exists()


def test_export_refuses_a_nonzero_unembedding_bias(tmp_path) -> None:
    cfg = GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=1, n_heads=2, unembed_bias=True)
    model = GPT(cfg)
    with torch.no_grad():
        model.unembed.b_U[3] = 0.5
    with pytest.raises(GlassError, match=r"unembed\.b_U"):
        to_hf(model, tmp_path)


def test_export_writes_gpt2_config_json(tmp_path) -> None:
    model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=1, n_heads=2, dropout=0.1))
    to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert (config["resid_pdrop"], config["embd_pdrop"], config["attn_pdrop"]) == (0.1,) * 3
    assert config_from_hf(config) == model.config.replace(unembed_bias=False)  # b_U = 0 dropped


@torch.no_grad()
def test_headless_gpt2model_loads_as_the_tied_model() -> None:
    hf = _random_hf(SHAPES["tied-gelu_new"])
    x = _tokens(50, 16)
    headless = from_hf(hf.transformer)  # GPT2Model: keys without "transformer.", no lm_head
    assert _max_diff(headless(x), hf(x).logits) <= 1e-5
