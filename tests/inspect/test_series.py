"""``glassgpt inspect --over-checkpoints``: head scores over a series of checkpoints.

A hub cache laid out in ``tmp_path`` (as tests/test_hub.py lays it out, the network off)
holds three revisions (tags step1000, step2000, step3000) of a tiny random GPT-NeoX; each
revision's scores must equal those read from transformers' own attention patterns on the
same repeated tokens. A run folder's step checkpoints are a series too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.runs import write_run
from tests.test_hub import add_snapshot

from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.inspect import head_scores
from glassgpt.inspect.series import expand_braces, expand_series
from glassgpt.model.probes import repeated_random_tokens
from glassgpt.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

REPO = "tiny-org/tiny-neox"
V, N_CTX = 40, 16
STEPS = (1000, 2000, 3000)


def neox(seed: int) -> torch.nn.Module:
    config = transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=N_CTX, rotary_pct=0.5,
        use_parallel_residual=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim > 1 else 0.1) + (p.ndim == 1) * 0.0)
    return model


@pytest.fixture(scope="module")
def models() -> dict[int, torch.nn.Module]:
    return {step: neox(seed) for seed, step in enumerate(STEPS)}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models) -> Path:
    cache = tmp_path / "home" / "hub"
    for step, model in models.items():
        saved = tmp_path / "saved" / str(step)
        model.save_pretrained(saved)
        add_snapshot(cache, REPO, f"{step:040x}", saved, [f"step{step}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    return cache


def their_scores(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Head scores from transformers' patterns on head_scores' default tokens."""
    n = N_CTX // 2
    x = repeated_random_tokens(V, n, 8, seed=0)
    with torch.no_grad():
        pattern = torch.stack(model(x, output_attentions=True).attentions).mean(1)
    i, j = torch.arange(n, 2 * n), torch.arange(1, 2 * n)
    return {
        "induction": pattern[:, :, i, i - n + 1].mean(-1).numpy(),
        "duplicate_token": pattern[:, :, i, i - n].mean(-1).numpy(),
        "previous_token": pattern[:, :, j, j - 1].mean(-1).numpy(),
    }


def by_head(record: dict, score: str) -> np.ndarray:
    return np.array([[record[f"{score}/L{layer}H{h}"] for h in range(2)] for layer in range(2)])


@pytest.mark.parametrize(
    "series",
    [
        f"hf:{REPO}@step{{1000..3000..1000}}",
        f"hf:{REPO}@step{{3000,1000,2000}}",
        f"hf:{REPO}@step1000,step2000,step3000",
    ],
)
def test_scores_over_revisions_equal_transformers_patterns(
    cache, models, tmp_path, capsys, series
) -> None:
    out = tmp_path / "over.png"
    assert main(["inspect", "--over-checkpoints", series, "-o", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    records = data["checkpoints"]
    assert [r["step"] for r in records] == list(STEPS)
    for r in records:
        theirs = their_scores(models[r["step"]])
        for score, want in theirs.items():
            np.testing.assert_allclose(by_head(r, score), want, rtol=0, atol=1e-5)
    a, b = by_head(records[0], "previous_token"), by_head(records[2], "previous_token")
    assert np.abs(a - b).max() > 1e-3  # each revision's own weights
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "3 checkpoints" in capsys.readouterr().out


def test_a_revision_missing_from_the_cache_is_one_line_naming_it(cache, tmp_path, capsys):
    out = tmp_path / "over.png"
    series = f"hf:{REPO}@step{{1000..4000..1000}}"
    assert main(["inspect", "--over-checkpoints", series, "-o", str(out)]) != 0
    err = capsys.readouterr().err
    assert "step4000" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()  # checked before any revision is scored


def test_a_run_folders_step_checkpoints_are_a_series(tmp_path, capsys, tiny) -> None:
    tok = CharTokenizer.train(["abcdefghij"])
    config = tiny.config(n_vocab=tok.n_vocab, n_ctx=8)
    first, second = tiny.model(config, seed=1), tiny.model(config, seed=2)
    run = tmp_path / "run"
    write_run(run, first, tok, steps=(10,))
    write_run(run, second, tok, steps=(20,))
    out = tmp_path / "steps.png"
    assert main(["inspect", "--over-checkpoints", str(run), "-o", str(out)]) == 0
    records = json.loads(out.with_suffix(".json").read_text())["checkpoints"]
    assert [r["step"] for r in records] == [10, 20]
    for r, model in zip(records, (first, second), strict=True):
        want = head_scores(model).induction.numpy()
        np.testing.assert_allclose(by_head(r, "induction")[:2, :2], want[:2, :2], atol=1e-5)


def test_series_spellings() -> None:
    assert expand_braces("s{0..4..2}") == ["s0", "s2", "s4"]
    assert [p.step for p in expand_series("hf:o/m@step{1000..143000..71000}")] == [
        1000,
        72000,
        143000,
    ]
    for bad, message in [
        ("hf:o/m", "needs @REVISIONS"),
        ("hf:o/m@step{1..9..0}", "must be ≥ 1"),
        ("hf:o/m@step{1..}", "not a range or a list"),
        ("hf:o/m@step{0..9999999}", "more than"),
    ]:
        with pytest.raises(GlassError, match=message):
            expand_series(bad)
