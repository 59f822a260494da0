"""A served bf16, int8 or int4 model decodes through the engine ``generate`` uses: its slots
hold the decoding copy's float32 keys and values and its steps are replayed, so a greedy
or seeded completion through the real server and the ``openai`` client equals ``glassgpt
sample --dtype`` (and ``generate``) token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.serve.conftest import start_server, tiny_run

from glassgpt.checkpoint import load
from glassgpt.cli import main
from glassgpt.kernels import rowwise
from glassgpt.model import precision
from glassgpt.model.precision import cast
from glassgpt.sample.generation import generate
from glassgpt.serve.app import create_app

openai = pytest.importorskip("openai", reason="the openai client is a dev dependency")
pytestmark = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")

PROMPTS = ["ROMEO:", "Is it so? ", "q"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("dtypes") / "tiny")


@pytest.mark.parametrize(
    ("dtype", "panels"),
    [("bf16", False), ("bf16", True), ("int8", False), ("int4", False)],
)
def test_served_dtype_equals_sample(
    run: Path, dtype: str, panels: bool, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    if panels:  # the tiny model as a large one: bf16 panels under float32 activations
        monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)
    base, tok = load(run)
    model = cast(base, dtype)
    threads = torch.get_num_threads()
    app = create_app(model, tok, name="tiny", slots=4)
    server, thread, url = start_server(app)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        served = []
        for i, prompt in enumerate(PROMPTS):
            greedy = client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                               temperature=0)  # fmt: skip
            chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                               temperature=1.0, seed=i, stream=True)  # fmt: skip
            served.append((greedy.choices[0].text,
                           "".join(c.choices[0].text for c in chunks if c.choices)))  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        torch.set_num_threads(threads)
    scheduler = app.state.glassgpt.scheduler
    decoders = list(scheduler.decoders.values())
    assert decoders and all(d.kind == "replayed" for d in decoders), [d.why for d in decoders]
    if dtype == "bf16":  # the slots are the decoding copy's: float32 activations and cache
        assert scheduler.decoding is not model
        assert scheduler.cache.layers[0].k.dtype == torch.float32
        assert next(model.parameters()).dtype == torch.bfloat16
        shared = scheduler.decoding.blocks[0].attn.W_QKV is model.blocks[0].attn.W_QKV
        assert shared == panels  # large: the bf16 weights themselves; small: a float32 copy
    eos = tok.special_tokens["<|endoftext|>"]
    for i, (prompt, (greedy, sampled)) in enumerate(zip(PROMPTS, served, strict=True)):
        for t, seed, text in ((0.0, None, greedy), (1.0, i, sampled)):
            ids = generate(model, tok.encode(prompt), tokenizer=tok, max_new_tokens=24,
                           temperature=t, seed=seed, stop_ids=(eos,))  # fmt: skip
            assert text == tok.decode(ids), (prompt, t)
        # the command line: the prompt, then the same greedy text
        capsys.readouterr()
        args = ["sample", "-c", str(run), "--dtype", dtype, "-p", prompt, "-t", "0", "-m", "24"]
        try:
            assert main(args) == 0
        finally:
            torch.set_num_threads(threads)
        assert capsys.readouterr().out == prompt + greedy + "\n"
