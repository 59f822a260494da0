"""``glassgpt serve --steer``: every request is generated (and its prompt scored) by the
steered model, as ``generate(..., steer=...)`` does; a bad vector stops the server before it
starts, in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.serve.conftest import request, start_server, tiny_run

from glassgpt.cli import main
from glassgpt.sample import generate
from glassgpt.sample.steering import Steer, save_vector, steered

ALPHA = 3.0


@pytest.fixture(scope="module")
def steered_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Any]]:
    """(url, run folder, the Steer) of a server started by ``glassgpt serve --steer``."""
    import sys

    import uvicorn

    folder = tmp_path_factory.mktemp("steer")
    run = tiny_run(folder / "tiny")
    v = torch.randn(32, generator=torch.Generator().manual_seed(0))
    save_vector(folder / "v.safetensors", v)
    served: list[Any] = []
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
        mp.setattr(sys, "setswitchinterval", lambda _: None)
        try:
            argv = ["serve", "-c", str(run), "--name", "tiny",
                    "--steer", f"{folder / 'v.safetensors'}:blocks.0.hook_resid_post:{ALPHA}"]  # fmt: skip
            assert main(argv) == 0
        finally:
            torch.set_num_threads(threads)
    server, thread, url = start_server(served[0])
    yield url, run, Steer("blocks.0.resid_post", v, ALPHA)
    server.should_exit = True
    thread.join(timeout=10)


def test_served_completions_are_steered(steered_server: tuple[str, Path, Any]) -> None:
    from glassgpt.checkpoint import load

    url, run, steer = steered_server
    model, tok = load(run)
    eos = tok.special_tokens["<|endoftext|>"]
    prompts = ["To be, or not", "Once"]
    body = {"model": "tiny", "prompt": prompts, "max_tokens": 16, "temperature": 0.9, "seed": 4}
    status, out = request(url, "/v1/completions", body)
    assert status == 200, out
    texts = [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])]
    for index, (prompt, text) in enumerate(zip(prompts, texts)):  # choice i: seed + i
        opts = {"max_new_tokens": 16, "temperature": 0.9, "seed": 4 + index, "stop_ids": (eos,)}
        want = generate(model, tok.encode(prompt), steer=[steer], **opts)
        assert text == tok.decode(want)
        assert text != tok.decode(generate(model, tok.encode(prompt), **opts))


def test_echoed_prompt_logprobs_are_the_steered_models(
    steered_server: tuple[str, Path, Any],
) -> None:
    from glassgpt.checkpoint import load

    url, run, steer = steered_server
    model, tok = load(run)
    prompt = "steer me"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 0}
    status, out = request(url, "/v1/completions", body)
    assert status == 200, out
    got = out["choices"][0]["logprobs"]["token_logprobs"][1 : len(prompt)]
    ids = tok.encode(prompt)
    with torch.no_grad(), steered(model, [steer]):
        logp = torch.log_softmax(model(torch.tensor([ids]))[0], dim=-1)
    want = [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert got == pytest.approx(want, abs=1e-5)
    assert not model._hook_fns


def test_bad_steer_stops_the_server_in_one_line(
    steered_server: tuple[str, Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, run, _ = steered_server
    save_vector(tmp_path / "short.npy", torch.ones(5))
    assert main(["serve", "-c", str(run), "--steer", f"{tmp_path / 'short.npy'}:embed:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "width 5" in err and "d_model = 32" in err and "\n" not in err
