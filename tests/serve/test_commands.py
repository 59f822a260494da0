"""``glassgpt serve``'s bad input: one line on stderr, exit status 2, no server started."""

from __future__ import annotations

from pathlib import Path

import pytest

from glassgpt.cli import main


def test_serve_is_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--api-key" in out and "--host" in out and "127.0.0.1" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--port", "70000"], "--port"),
        (["--max-batch", "0"], "--max-batch"),
        (["--threads", "0"], "--threads"),
        (["--dtype", "int3"], "dtype: unknown dtype 'int3'"),
    ],
)
def test_bad_flags(live: object, extra: list[str], message: str,
                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["serve", "--checkpoint", str(live.run), *extra]) == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err.strip()
    assert err.startswith("glassgpt: error:") and message in err and "\n" not in err


def test_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--checkpoint", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such checkpoint" in err and "\n" not in err


def test_serve_int8_serves_the_int8_copy(live: object, monkeypatch) -> None:
    """--dtype int8: the served model is cast's int8 copy (its completions are that model's)."""
    import sys

    import torch
    import uvicorn

    from glassgpt.checkpoint import load
    from glassgpt.kernels import is_packed
    from glassgpt.model.precision import cast
    from glassgpt.sample import generate

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    monkeypatch.setattr(sys, "setswitchinterval", lambda _: None)
    threads = torch.get_num_threads()
    try:
        assert main(["serve", "--checkpoint", str(live.run), "--dtype", "int8"]) == 0  # type: ignore[attr-defined]
    finally:
        torch.set_num_threads(threads)
    model = served[0].state.glassgpt.model
    assert is_packed(model.blocks[0].attn.W_QKV)
    base, _ = load(live.run)  # type: ignore[attr-defined]
    want = generate(cast(base, "int8"), [1, 2, 3], max_new_tokens=10, temperature=0)
    assert generate(model, [1, 2, 3], max_new_tokens=10, temperature=0) == want


def test_serve_float32_registers_the_kernels_in_place(live: object, monkeypatch) -> None:
    """--dtype float32 (the default): the loaded model itself, its projections registered with
    glassgpt's kernels (no copy), so its steps replay; its completions are the inference
    copy's."""
    import sys

    import torch
    import uvicorn

    from glassgpt.checkpoint import load
    from glassgpt.kernels import is_packed
    from glassgpt.model.precision import cast
    from glassgpt.sample import generate

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    monkeypatch.setattr(sys, "setswitchinterval", lambda _: None)
    threads = torch.get_num_threads()
    try:
        assert main(["serve", "--checkpoint", str(live.run)]) == 0  # type: ignore[attr-defined]
    finally:
        torch.set_num_threads(threads)
    model = served[0].state.glassgpt.model
    assert is_packed(model.blocks[0].attn.W_QKV) and not model.training
    base, _ = load(live.run)  # type: ignore[attr-defined]
    want = generate(cast(base, "float32"), [1, 2, 3], max_new_tokens=10, temperature=0)
    assert generate(model, [1, 2, 3], max_new_tokens=10, temperature=0) == want
