"""``glassgpt patch`` and ``glassgpt ablate``: the numbers are the API's, bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.inspect import ablation, metrics, patching
from glassgpt.inspect.cache import run_with_cache, run_with_hooks
from glassgpt.tokenizer import CharTokenizer

TEXT = "abcdefgh xyz"
CLEAN, CORRUPT = "abc dab", "abx dxb"


def _load(monkeypatch: pytest.MonkeyPatch, tiny: SimpleNamespace, **cfg: object) -> SimpleNamespace:
    tok = CharTokenizer.train([TEXT])
    model = tiny.model(tiny.config(n_vocab=tok.n_vocab, n_ctx=12, **cfg), seed=3)
    tiny.open_as(monkeypatch, model, tok)
    return SimpleNamespace(model=model, tokenizer=tok)


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch, tiny: SimpleNamespace) -> SimpleNamespace:
    """A random float64 model (2 layers, 3 heads) behind the commands' ``open_run``."""
    return _load(monkeypatch, tiny)


def only_the_gap_note(err: str) -> bool:
    """stderr is empty, or the one-line note that the clean and corrupted runs differ little
    (these random models' do)."""
    lines = err.splitlines()
    return len(lines) <= 1 and all(x.startswith("glassgpt: note: ") and "m̂" in x for x in lines)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def ids(tok: CharTokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tok.encode(text)])


def expected_patch(s: SimpleNamespace, wrong: str | None) -> dict[str, torch.Tensor]:
    """The four sweeps, called directly."""
    model, tok = s.model, s.tokenizer
    answer = tok.encode("c")[0]
    raw = (
        metrics.logprob(answer)
        if wrong is None
        else metrics.logit_diff(answer, tok.encode(wrong)[0])
    )
    clean_logits, cache = run_with_cache(
        model, ids(tok, CLEAN), ["resid_pre", "attn_out", "mlp_out", "attn.z"]
    )
    corrupt = ids(tok, CORRUPT)
    metric = metrics.normalised(raw, clean_logits, run_with_hooks(model, corrupt, {}))
    return {
        "resid": patching.get_act_patch_resid_pre(model, corrupt, cache, metric),
        "attn": patching.get_act_patch_attn_out(model, corrupt, cache, metric),
        "mlp": patching.get_act_patch_mlp_out(model, corrupt, cache, metric),
        "heads": patching.get_act_patch_attn_head_out_all_pos(model, corrupt, cache, metric),
    }


@pytest.mark.parametrize("wrong", ["x", None])
def test_patch_writes_the_apis_values_and_a_figure_per_site(
    wrong: str | None, loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["patch", "-c", str(tmp_path), "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "c"]
    code, stdout, err = run([*args, *(["--wrong", wrong] if wrong else []), "-o", str(out)], capsys)
    assert code == 0 and only_the_gap_note(err)
    doc = json.loads((out / "patch.json").read_text(encoding="utf-8"))
    want = expected_patch(loaded, wrong)
    assert list(doc["results"]) == ["resid", "attn", "mlp", "heads"]
    for what, values in want.items():
        got = doc["results"][what]
        assert torch.equal(torch.tensor(got["values"], dtype=torch.float64), values), what
        assert got["axes"] == ["layer", "head" if what == "heads" else "position"]
        assert (out / got["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"{what}: largest" in stdout
    assert doc["clean_tokens"] == list(CLEAN) and doc["corrupted_tokens"] == list(CORRUPT)
    assert ("logit difference" in doc["metric"]) == (wrong is not None)
    # the normalisation's ends are the metric on the two unpatched runs
    model, tok = loaded.model, loaded.tokenizer
    a = tok.encode("c")[0]
    raw = metrics.logprob(a) if wrong is None else metrics.logit_diff(a, tok.encode(wrong)[0])
    assert doc["metric_clean"] == float(raw(run_with_hooks(model, ids(tok, CLEAN), {})))
    assert doc["metric_corrupted"] == float(raw(run_with_hooks(model, ids(tok, CORRUPT), {})))


def test_patch_what_selects_sites_in_order(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["patch", "-c", str(tmp_path), "--clean", CLEAN, "--corrupt", CORRUPT]
    code, _, err = run(
        [*args, "--answer", "c", "--what", "heads, resid", "-o", str(tmp_path / "o")], capsys
    )
    assert code == 0 and only_the_gap_note(err)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "patch.json",
        "patch_heads.png",
        "patch_resid.png",
    ]
    doc = json.loads((tmp_path / "o" / "patch.json").read_text(encoding="utf-8"))
    assert list(doc["results"]) == ["heads", "resid"]


PATCH = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "c"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--clean", "abc", "--corrupt", "abcd", "--answer", "c"],
            "the clean prompt is 3 tokens and the corrupted one 4: "
            "patching needs prompts of the same length",
        ),
        (
            ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "cd"],
            "--answer 'cd' is 2 tokens ('c' 'd'), not one: give a single token",
        ),
        ([*PATCH, "--wrong", ""], "--wrong '' is 0 tokens (nothing), not one"),
        ([*PATCH, "--what", "resid,mlps"], "--what: unknown site 'mlps'; choose from resid, attn"),
        ([*PATCH, "--what", ","], "--what ',' names no site"),
        ([*PATCH, "--answer", "c", "--wrong", "c"], "cannot normalise"),
    ],
)
def test_patch_bad_input_is_one_line_and_exit_2(
    argv: list[str],
    message: str,
    loaded: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    code, _, err = run(["patch", "-c", str(tmp_path), *argv, "-o", str(out)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("glassgpt: error: ")
    assert message in err
    assert not out.exists()


def test_patch_refuses_mlp_on_an_attention_only_model(
    monkeypatch: pytest.MonkeyPatch,
    tiny: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _load(monkeypatch, tiny, attn_only=True)
    base = ["patch", "-c", str(tmp_path), *PATCH, "-o", str(tmp_path / "o")]
    code, _, err = run([*base, "--what", "attn,mlp"], capsys)
    assert (code, err) == (
        2,
        "glassgpt: error: --what mlp: this model is attention-only (it has no MLPs)\n",
    )
    code, _, err = run(base, capsys)  # the default: every site the model has
    assert code == 0 and only_the_gap_note(err)
    doc = json.loads((tmp_path / "o" / "patch.json").read_text(encoding="utf-8"))
    assert list(doc["results"]) == ["resid", "attn", "heads"]


def ablate_expected(s: SimpleNamespace, prompt: str, **ablate: object) -> dict[str, object]:
    tokens = ids(s.tokenizer, prompt)
    before = run_with_hooks(s.model, tokens, {})
    after = ablation.run_ablated(s.model, tokens, **ablate)
    loss = metrics.loss(tokens)
    return {"before": float(loss(before)), "after": float(loss(after)), "logits": (before, after)}


@pytest.mark.parametrize(
    ("flags", "api"),
    [
        (["--heads", "0.1,1.2", "--mlps", "1"], {"heads": [(0, 1), (1, 2)], "mlps": [1]}),
        (["--neurons", "0:3,1:15", "--how", "mean"], {"neurons": [(0, 3), (1, 15)], "how": "mean"}),
        (["--heads", "1.0", "--keep"], {"heads": [(1, 0)], "keep": True}),
        (
            ["--heads", "0.2", "--how", "resample", "--reference", "xyz abcd"],
            {"heads": [(0, 2)], "how": "resample", "reference": "xyz abc"},
        ),
    ],
)
def test_ablate_reports_the_apis_loss_and_next_token_distribution(
    flags: list[str],
    api: dict[str, object],
    loaded: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "ablate.json"
    code, stdout, err = run(
        ["ablate", "-c", str(tmp_path), "--prompt", CLEAN, *flags, "-o", str(out)], capsys
    )
    assert (code, err) == (0, "")
    if isinstance(api.get("reference"), str):
        api = {**api, "reference": ids(loaded.tokenizer, str(api["reference"]))}
    want = ablate_expected(loaded, CLEAN, **api)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["loss"] == {"before": want["before"], "after": want["after"]}
    assert f"{want['before']:.4f} → {want['after']:.4f}" in stdout
    before, after = want["logits"]  # type: ignore[misc]
    p_b, p_a = before[0, -1].softmax(-1), after[0, -1].softmax(-1)
    top = set(p_b.topk(5).indices.tolist()) | set(p_a.topk(5).indices.tolist())
    assert {r["id"] for r in doc["next_token"]} == top
    for r in doc["next_token"]:
        assert abs(r["before"] - float(p_b[r["id"]])) < 1e-12
        assert abs(r["after"] - float(p_a[r["id"]])) < 1e-12
        assert r["token"] == loaded.tokenizer.decode([r["id"]])
    assert doc["kl_next_token"] > 0


def test_ablate_mean_over_a_reference_file(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refs = tmp_path / "refs.txt"
    refs.write_text("xyz ab\n\nhgf edcba\n", encoding="utf-8")
    out = tmp_path / "a.json"
    flags = ["--heads", "1.1", "--how", "mean", "--reference-file", str(refs), "-o", str(out)]
    code, _, err = run(["ablate", "-c", str(tmp_path), "--prompt", CLEAN, *flags], capsys)
    assert (code, err) == (0, "")
    tok = loaded.tokenizer
    batches = [ids(tok, "xyz ab"), ids(tok, "hgf edcba")]
    want = ablate_expected(loaded, CLEAN, heads=[(1, 1)], how="mean", reference=batches)
    assert json.loads(out.read_text(encoding="utf-8"))["loss"]["after"] == want["after"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--heads", "0.3"], "head (0, 3): head 3 is out of range [0, 3)"),
        (["--heads", "2.0"], "head (2, 0): layer 2 is out of range [0, 2)"),
        (["--heads", "0-1"], "--heads: '0-1' is not of the form L.H (integers)"),
        (["--neurons", "1:16"], "neuron 16 is out of range [0, 16)"),
        (["--mlps", "x"], "--mlps: 'x' is not of the form L (integers)"),
        ([], "nothing to ablate"),
        (["--heads", "0.1", "--reference", "abc"], "--reference is for --how mean or resample"),
        (
            ["--heads", "0.1", "--how", "resample", "--reference", "ab"],
            "resampling needs references at least as long as the prompt (7 tokens); the shortest is 2",
        ),
        (["--heads", "0.1", "--how", "resample"], "resample ablation needs reference tokens"),
    ],
)
def test_ablate_bad_input_is_one_line_and_exit_2(
    flags: list[str],
    message: str,
    loaded: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "a.json"
    code, _, err = run(
        ["ablate", "-c", str(tmp_path), "--prompt", CLEAN, *flags, "-o", str(out)], capsys
    )
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("glassgpt: error: ")
    assert message in err
    assert not out.exists()


def test_ablate_refuses_mlps_of_an_attention_only_model(
    monkeypatch: pytest.MonkeyPatch,
    tiny: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _load(monkeypatch, tiny, attn_only=True)
    code, _, err = run(["ablate", "-c", str(tmp_path), "--prompt", CLEAN, "--mlps", "0"], capsys)
    assert code == 2 and "the model is attention-only" in err and err.count("\n") == 1


def test_patch_from_a_checkpoint_folder(
    tmp_path: Path, tiny: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run as the trainer writes it, read back by the real ``open_run``."""
    tok = CharTokenizer.train([TEXT])
    cfg = tiny.config(n_vocab=tok.n_vocab, n_ctx=12)
    model = tiny.model(cfg, dtype=torch.float32)
    folder = write_run(tmp_path / "run", model, tok)
    out = tmp_path / "o"
    code, _, err = run(
        ["patch", "-c", str(folder), *PATCH, "--wrong", "x", "--what", "resid", "-o", str(out)],
        capsys,
    )
    assert code == 0 and only_the_gap_note(err)
    values = json.loads((out / "patch.json").read_text(encoding="utf-8"))["results"]["resid"]
    assert len(values["values"]) == cfg.n_layers and len(values["values"][0]) == len(CLEAN)
    assert (out / "patch_resid.png").exists()


def test_patch_identical_prompts_name_the_tokens_text(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["patch", "-c", str(tmp_path), "--clean", CLEAN, "--corrupt", CLEAN, "--answer", "c"]
    code, _, err = run([*args, "--wrong", " ", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("glassgpt: error: cannot normalise logit_diff('c', '␣'): it is ")
    assert "[" not in err  # not the ids, logit_diff([2], [0])


def gap_notes(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("glassgpt: note: ") and "m̂" in x]


def test_patch_notes_once_when_clean_and_corrupted_differ_little(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """|m_clean − m_corrupted| = 0.087 beside m ≈ 2: m̂ is mostly noise; 2.12 is not."""
    args = ["patch", "-c", str(tmp_path), "--answer", "c", "--wrong", "x", "--what", "resid"]
    code, _, err = run([*args, "--clean", CLEAN, "--corrupt", CORRUPT, "-o", str(tmp_path)], capsys)
    doc = json.loads((tmp_path / "patch.json").read_text(encoding="utf-8"))
    m_clean, m_corrupted = doc["metric_clean"], doc["metric_corrupted"]
    assert abs(m_clean - m_corrupted) < 0.1 < 2.0 < m_clean  # the case the note is for
    assert code == 0 and len(gap_notes(err)) == 1 and err.count("\n") == 1
    assert f"logit_diff('c', 'x') is {m_clean:.4g} on the clean run and {m_corrupted:.4g}" in err
    code, _, err = run(
        [*args, "--clean", CLEAN, "--corrupt", "abc dax", "-o", str(tmp_path)], capsys
    )
    assert (code, err) == (0, "")  # 2.036 against −0.088: no note
