"""Every command, run as a subprocess, against bad input: a non-zero exit, one short line, no
traceback, and the input files untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glassgpt.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"

TINY = ["train.progress=false", "train.threads=1", "train.batch_size=4", "train.eval_batches=1",
        "train.sample_tokens=0", "train.max_steps=4", "train.eval_every=4",
        "model.n_ctx=16", "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of good and bad inputs, and a tiny trained run (``run``)."""
    d = tmp_path_factory.mktemp("inputs")
    good = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(400))
    (d / "good.txt").write_text(good, "utf-8")
    (d / "empty.txt").write_bytes(b"")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 50)
    (d / "binary.bin").write_bytes(bytes(range(256)) * 8)
    assert main(["tokenizer", "train", "--input", str(d / "good.txt"), "--vocab-size", "300",
                 "--output", str(d / "tok.json")]) == 0  # fmt: skip
    text = (d / "tok.json").read_text("utf-8")
    (d / "truncated.json").write_text(text[: len(text) // 2], "utf-8")
    doc = json.loads(text)
    doc["merges"][0] = ["a", 1, 2]
    (d / "badmerge.json").write_text(json.dumps(doc), "utf-8")
    (d / "truncated.toml").write_text("[model]\nn_layers = ", "utf-8")
    (d / "scalar.toml").write_text("model = 3\n", "utf-8")
    run = d / "run"
    assert main(["train", "--preset", "cpu-tiny", "--data", str(d / "good.txt"), "--out",
                 str(run), "--set", *TINY]) == 0  # fmt: skip
    (d / "corrupt_run" / "ckpt" / "step_000001").mkdir(parents=True)
    (d / "corrupt_run" / "ckpt" / "step_000001" / "state.json").write_text("{not json")
    return d


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".lock" not in p.name
    }


CASES = {
    "tokenizer train: missing input": (["tokenizer", "train", "--input", "{d}/missing.txt", "--vocab-size", "300", "--output", "{out}/t.json"], ""),
    "tokenizer train: empty input": (["tokenizer", "train", "--input", "{d}/empty.txt", "--vocab-size", "300", "--output", "{out}/t.json"], ""),
    "tokenizer train: not UTF-8": (["tokenizer", "train", "--input", "{d}/latin1.txt", "--vocab-size", "300", "--output", "{out}/t.json"], ""),
    "tokenizer train: binary": (["tokenizer", "train", "--input", "{d}/binary.bin", "--vocab-size", "300", "--output", "{out}/t.json"], ""),
    "tokenizer train: negative vocab": (["tokenizer", "train", "--input", "{d}/good.txt", "--vocab-size", "-5", "--output", "{out}/t.json"], ""),
    "tokenizer train: unwritable output": (["tokenizer", "train", "--input", "{d}/good.txt", "--vocab-size", "300", "--output", "{d}/good.txt/t.json"], ""),
    "tokenizer encode: truncated file": (["tokenizer", "encode", "--tokenizer", "{d}/truncated.json"], "hello"),
    "tokenizer encode: malformed merge": (["tokenizer", "encode", "--tokenizer", "{d}/badmerge.json"], "hello"),
    "tokenizer encode: missing file": (["tokenizer", "encode", "--tokenizer", "{d}/missing.json"], "hello"),
    "tokenizer decode: id out of range": (["tokenizer", "decode", "--tokenizer", "{d}/tok.json"], "1 2 99999999"),
    "tokenizer decode: not ids": (["tokenizer", "decode", "--tokenizer", "{d}/tok.json"], "one two"),
    "tokenizer stats: missing": (["tokenizer", "stats", "--tokenizer", "{d}/tok.json", "{d}/missing.txt"], ""),
    "data prepare: not UTF-8": (["data", "prepare", "--input", "{d}/latin1.txt", "--char", "--output", "{out}/data"], ""),
    "data prepare: empty": (["data", "prepare", "--input", "{d}/empty.txt", "--char", "--output", "{out}/data"], ""),
    "data info: missing": (["data", "info", "{d}/missing"], ""),
    "train: truncated config": (["train", "--config", "{d}/truncated.toml", "--out", "{out}/r"], ""),
    "train: scalar section": (["train", "--config", "{d}/scalar.toml", "--out", "{out}/r"], ""),
    "train: unknown preset": (["train", "--preset", "nope", "--out", "{out}/r"], ""),
    "train: heads do not divide": (["train", "--preset", "cpu-tiny", "--out", "{out}/r", "--set", "model.n_heads=7"], ""),
    "train: huge seed": (["train", "--preset", "cpu-tiny", "--out", "{out}/r", "--set", "seed=99999999999999999999"], ""),
    "train: resume missing": (["train", "--resume", "{d}/missing"], ""),
    "train: resume corrupt": (["train", "--resume", "{d}/corrupt_run"], ""),
    "train: out is a run": (["train", "--preset", "cpu-tiny", "--out", "{d}/run"], ""),
    "sample: missing checkpoint": (["sample", "--checkpoint", "{d}/missing", "--prompt", "a"], ""),
    "sample: a device this machine lacks": (["sample", "--checkpoint", "{d}/run", "--prompt", "a", "--device", "mps"], ""),
    "sample: negative temperature": (["sample", "--checkpoint", "{d}/run", "--prompt", "def", "--temperature", "-1"], ""),
    "sample: prompt past the context": (["sample", "--checkpoint", "{d}/run", "--prompt", "x" * 200, "--overflow", "error"], ""),
    "sample: prompt file not UTF-8": (["sample", "--checkpoint", "{d}/run", "--prompt-file", "{d}/latin1.txt"], ""),
    "inspect: empty prompt": (["inspect", "--checkpoint", "{d}/run", "--prompt", "", "--output", "{out}/r.html"], ""),
    "inspect: layer out of range": (["inspect", "--checkpoint", "{d}/run", "--prompt", "def f", "--layer", "99", "--head", "0", "--output", "{out}/r.html"], ""),
    "describe: unknown preset": (["describe", "--preset", "nope"], ""),
    "scaling fit: missing sweep": (["scaling", "fit", "{d}/missing"], ""),
    "sweep: missing grid": (["sweep", "--grid", "{d}/missing.toml", "--output", "{out}/s"], ""),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_touches_nothing(case: str, inputs: Path, tmp_path: Path) -> None:
    argv, stdin = CASES[case]
    argv = [a.format(d=inputs, out=tmp_path) for a in argv]
    before = digest(inputs)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop("GLASSGPT_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "glassgpt", *argv], input=stdin, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    err = proc.stderr
    assert proc.returncode != 0, (case, err)
    assert "Traceback" not in err + proc.stdout, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3 and lines[-1].startswith("glassgpt: error:"), err
    assert digest(inputs) == before  # the inputs are untouched
