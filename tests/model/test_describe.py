"""describe: every variant renders in both formats; the LaTeX parses; counts match the model."""

from __future__ import annotations

import itertools
import re

import pytest

from glassgpt.cli import main
from glassgpt.errors import ConfigError
from glassgpt.model.config import MLPS, NORMS, PLACEMENTS, POSITIONALS, GPTConfig
from glassgpt.model.describe import describe

TINY = {"n_vocab": 37, "n_ctx": 16, "d_model": 24, "n_layers": 2, "n_heads": 3}
VARIANTS = list(
    itertools.product(POSITIONALS, NORMS, PLACEMENTS, MLPS, (True, False), (True, False))
)


def _config(positional, norm, placement, mlp, tie, bias) -> GPTConfig:
    return GPTConfig(
        **TINY,
        positional=positional,
        norm=norm,
        norm_placement=placement,
        mlp=mlp,
        tie_embeddings=tie,
        bias=bias,
    )


def _math_lines(tex: str) -> list[str]:
    """Every formula of a LaTeX document: align* lines (alignment marks dropped) and $…$."""
    lines = []
    for body in re.findall(r"\\begin\{align\*\}\n(.*?)\n\\end\{align\*\}", tex, re.S):
        lines += [line.replace("&", " ") for line in body.split(" \\\\\n")]
    lines += re.findall(r"(?<!\\)\$(.+?)(?<!\\)\$", tex)
    return lines


def _model_numel(config: GPTConfig) -> int:
    from glassgpt.model import GPT

    return sum(p.numel() for p in GPT(config).parameters())


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_every_variant_renders_with_its_equations_and_true_count(variant) -> None:
    positional, norm, placement, mlp, tie, bias = variant
    config = _config(*variant)
    md = describe(config)
    total = re.search(r"^\| total N \|.*\| ([\d,]+) \|$", md, re.M)
    assert total is not None
    assert int(total.group(1).replace(",", "")) == _model_numel(config)
    assert f"{norm}, {placement}-norm, MLP {mlp}" in md
    assert ("x_mid = x_{ℓ−1} + Attn_ℓ(N1_ℓ(x_{ℓ−1}))" in md) == (placement == "pre")
    assert ("x_mid = N1_ℓ(x_{ℓ−1} + Attn_ℓ(x_{ℓ−1}))" in md) == (placement == "post")
    assert ("W_P[:n]" in md) == (positional == "learned")
    assert ("PE[p, 2i] = sin" in md) == (positional == "sinusoidal")
    assert ("rotation by p θ_i" in md) == (positional == "rope")
    assert ("√(mean(x²) + ε)" in md) == (norm == "rmsnorm")
    assert ("σ'(x W_in" in md) == (mlp in ("gated", "swiglu", "geglu"))
    assert ("logits = N_f(x_L)" in md) == (placement == "pre")
    assert ("W_Eᵀ" in md) == tie
    assert ("b_Q[h]" in md) == bias
    assert ("unembed.W_U" in md) == (not tie)
    tex = describe(config, fmt="latex")
    assert tex.isascii()
    assert tex.count(r"\begin{align*}") == tex.count(r"\end{align*}") == 2
    for line in _math_lines(tex):
        assert line.count("{") - line.count(r"\{") == line.count("}") - line.count(r"\}"), line


def test_latex_formulas_parse_as_tex() -> None:
    """matplotlib's mathtext is an independent TeX parser: every formula of every variant parses."""
    mathtext = pytest.importorskip("matplotlib.mathtext")
    parser = mathtext.MathTextParser("path")
    formulas = set()
    for variant in VARIANTS:
        formulas.update(_math_lines(describe(_config(*variant), fmt="latex")))
    assert len(formulas) > 50
    for formula in sorted(formulas):
        parser.parse(f"${formula}$")  # raises ValueError on unknown commands or bad braces


def test_flops_and_memory_sections_follow_the_arguments() -> None:
    config = GPTConfig.preset("gpt2")
    md = describe(config, seq_len=128, batch_size=2)
    assert "context T = 128" in md and "B = 2, T = 128" in md
    # the figures in the tables are those of the accounting module
    from glassgpt.model.accounting import flops_per_token
    from glassgpt.model.memory import estimate_training_memory, format_bytes

    assert f"| forward | `C_fwd` | {flops_per_token(config, 128).forward:,} |" in md
    mem = estimate_training_memory(config, 2, 128, "bfloat16")
    assert f"| {format_bytes(mem.activations)} |" in md.split("| activations |")[1].splitlines()[0]


def test_bad_format_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^format: "):
        describe(GPTConfig(**TINY), fmt="html")


def test_cli_preset_with_overrides_in_latex(capsys) -> None:
    assert (
        main(["describe", "--preset", "cpu-tiny", "--set", "n_layers=2", "--format", "latex"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(r"\documentclass{article}") and r"\end{document}" in out
    assert r"\ell = 1, \ldots, 2" in out


def test_cli_config_file_with_model_table(tmp_path, capsys) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "cpu-tiny"\nmlp = "swiglu"\n[train]\nlr = 0.001\n')
    out_path = tmp_path / "f.md"
    assert (
        main(["describe", "--config", str(path), "--set", "model.n_heads=2", "-o", str(out_path)])
        == 0
    )
    text = out_path.read_text()
    assert "MLP swiglu" in text and "H = n_heads = 2" in text
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "argv, start",
    [
        (["--preset", "cpu-tiny", "--set", "n_heads=5"], "glassgpt: error: n_heads: "),
        (["--preset", "nope"], "glassgpt: error: preset: "),
        (["--preset", "cpu-tiny", "--set", "positional=alibi"], "glassgpt: error: positional: "),
        (["--config", "/no/such/file.toml"], "glassgpt: error: config file not found"),
    ],
)
def test_cli_bad_config_exits_nonzero_with_one_line(argv, start, capsys) -> None:
    assert main(["describe", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1


def test_describe_runs_in_a_fresh_process() -> None:
    """The command as a user starts it (the stages import plainly, torch included: only
    ``glassgpt --help`` stays free of it, issue 41)."""
    import subprocess
    import sys

    code = (
        "import sys; from glassgpt.cli import main; "
        "sys.exit(main(['describe', '--preset', 'gpt2', '--format', 'latex']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "" and r"\begin{align*}" in out.stdout
