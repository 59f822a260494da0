"""lm-evaluation-harness through glassgpt's own adapter against the harness's ``hf`` backend on
the ``glassgpt export --format hf`` folder of the same weights: the same log-likelihood of
every request (1e-4) and the same metrics on a local multiple-choice task and a rolling
(perplexity) task; ``generate_until`` gives ``glassgpt sample``'s greedy text. Offline:
the tasks read JSONL files written here, the HF model loads from a local folder."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.model import GPT, GPTConfig
from glassgpt.sample import generate
from glassgpt.tokenizer import Tokenizer

WORDS = ("the", "cat", "dog", "sat", "ran", "on", "a", "mat", "under", "tree", "bird", "sang",
         "loud", "quiet", "red", "blue", "green", "house", "river", "stone", "light", "dark",
         "over", "and", "then", "it", "was")  # fmt: skip
N_CTX = 24


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run folder (glassgpt's checkpoint), its HF export, and a folder of three tasks."""
    from glassgpt.interop.export import export_hf

    root = tmp_path_factory.mktemp("lm_eval")
    rng = random.Random(0)
    corpus = "\n".join(_sentence(rng, 12) + "." for _ in range(300))
    tok = Tokenizer.train(corpus, 256 + 60, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=N_CTX, d_model=32, n_layers=2,
                          n_heads=2)).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    run = write_run(root / "run", model, tok)
    hf = root / "hf"
    export_hf(model, tok, hf)

    tasks, data = root / "tasks", root / "data"
    tasks.mkdir()
    data.mkdir()
    mc = [{"context": _sentence(rng, rng.randint(1, 30)),  # some longer than n_ctx
           "choices": [_sentence(rng, rng.randint(1, 6)) for _ in range(4)],
           "label": rng.randrange(4)} for _ in range(40)]  # fmt: skip
    for doc in mc[1:12]:  # a choice that is the model's greedy continuation: is_greedy true
        ids = generate(model, tok.encode(doc["context"] + ":")[-N_CTX + 1 :], max_new_tokens=2,
                       temperature=0)  # fmt: skip
        doc["choices"][0] = tok.decode(ids)
    docs = [{"text": _sentence(rng, rng.randint(1, 60)) + "."} for _ in range(25)]
    gen = [{"prompt": _sentence(rng, rng.randint(1, 10)), "answer": "x"} for _ in range(12)]
    common = "dataset_path: json\ntest_split: test\n"
    specs = {
        "glass_mc": (mc, "output_type: multiple_choice\ndoc_to_text: '{{context}}:'\n"
                     "target_delimiter: ''\n"
                     "doc_to_choice: choices\ndoc_to_target: label\n"
                     "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"),
        "glass_ppl": (docs, "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
                      "doc_to_target: text\nmetric_list:\n  - metric: word_perplexity\n"
                      "  - metric: byte_perplexity\n  - metric: bits_per_byte\n"),
        "glass_gen": (gen, "output_type: generate_until\ndoc_to_text: prompt\n"
                      "doc_to_target: answer\ngeneration_kwargs:\n  until: ['.', 'dark']\n"
                      "  max_gen_toks: 10\n  do_sample: false\n"
                      "metric_list:\n  - metric: exact_match\n"),
    }  # fmt: skip
    for name, (rows, body) in specs.items():
        path = data / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        kwargs = json.dumps(
            {"data_files": {"test": str(path)}, "cache_dir": str(root / "hf-cache")}
        )
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\n{common}dataset_kwargs: {kwargs}\n{body}", encoding="utf-8"
        )
    return {"run": run, "hf": hf, "tasks": tasks}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No network: the hub and datasets in offline mode (env and already-imported flags);
    one thread (a tiny model's ops are shorter than waking a thread pool on a busy CPU)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _evaluate(lm: object, setup: dict[str, Path], tasks: list[str]) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(setup["tasks"]), include_defaults=False)
    out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0,
                          log_samples=True, num_fewshot=0)  # fmt: skip
    assert out is not None
    return out


@pytest.fixture(scope="module")
def hf_lm(setup: dict[str, Path]) -> object:
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(setup["hf"]), batch_size=8, device="cpu", dtype="float32")


def _glass_lm(setup: dict[str, Path], batch_size: int = 5) -> object:
    from glassgpt.checkpoint import load
    from glassgpt.sample.lm_eval_adapter import GlassLM

    model, tok = load(setup["run"])
    return GlassLM(model, tok, batch_size=batch_size, progress=False)


def test_loglikelihoods_and_metrics_equal_the_hf_backend(setup, hf_lm, capsys, tmp_path) -> None:
    tasks = ["glass_mc", "glass_ppl"]
    ours, theirs = _evaluate(_glass_lm(setup), setup, tasks), _evaluate(hf_lm, setup, tasks)
    for task in tasks:
        a, b = ours["samples"][task], theirs["samples"][task]
        assert len(a) == len(b) > 0
        greedy = []
        for x, y in zip(a, b, strict=True):
            assert x["doc_id"] == y["doc_id"] and x["arguments"] == y["arguments"]
            for [mine], [ref] in zip(x["resps"], y["resps"], strict=True):
                mine, ref = (mine, ref) if isinstance(ref, tuple) else ((mine,), (ref,))
                assert mine[0] == pytest.approx(ref[0], rel=1e-4, abs=1e-4)
                assert mine[1:] == ref[1:]  # is_greedy
                greedy += mine[1:]
        assert task != "glass_mc" or 0 < sum(greedy) < len(greedy)
    for task, metrics in theirs["results"].items():
        for name, value in metrics.items():
            if isinstance(value, float) and "stderr" not in name:
                assert ours["results"][task][name] == pytest.approx(value, rel=1e-4), name
    acc = theirs["results"]["glass_mc"]["acc,none"]
    assert ours["results"]["glass_mc"]["acc,none"] == acc  # the same items right
    # the command: the same numbers, as one JSON object (and lm-eval's whole results in -o)
    code = main(["eval", "-c", str(setup["run"]), "--tasks", ",".join(tasks), "--include-path",
                 str(setup["tasks"]), "--json", "--bootstrap-iters", "0", "--batch-size", "3",
                 "-o", str(tmp_path / "r.json")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = json.loads(out)["results"]
    assert json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["results"] == printed
    for task in tasks:
        for name, value in theirs["results"][task].items():
            if isinstance(value, float) and "stderr" not in name:
                assert printed[task][name] == pytest.approx(value, rel=1e-4), name


def test_generate_until_equals_glassgpt_sample_greedy(setup, capsys) -> None:
    from lm_eval.api.instance import Instance

    lm = _glass_lm(setup, batch_size=4)
    rng = random.Random(5)
    prompts = [_sentence(rng, rng.randint(1, 9)) for _ in range(7)]
    until = ["river", "."]
    reqs = [Instance("generate_until", {}, (p, {"until": until, "max_gen_toks": 9}), i)
            for i, p in enumerate(prompts)]  # fmt: skip
    got = lm.generate_until(reqs)
    assert any(got)
    for prompt, text in zip(prompts, got, strict=True):
        argv = ["sample", "-c", str(setup["run"]), "-p", prompt, "-t", "0", "-m", "9"]
        code = main([*argv, *(a for s in until for a in ("--stop", s))])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out == prompt + text + "\n"


def test_generation_task_runs_with_hf_equal_answers(setup, hf_lm) -> None:
    ours, theirs = _evaluate(_glass_lm(setup), setup, ["glass_gen"]), None
    theirs = _evaluate(hf_lm, setup, ["glass_gen"])
    a = [s["resps"] for s in ours["samples"]["glass_gen"]]
    b = [s["resps"] for s in theirs["samples"]["glass_gen"]]
    assert a == b


def test_unknown_task_and_misplaced_flags_are_one_line(
    setup, capsys, monkeypatch, tmp_path
) -> None:
    import lm_eval.tasks

    class LocalOnly(lm_eval.tasks.TaskManager):  # lm-eval's catalogue takes seconds to index
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **{**kw, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalOnly)
    base = ["eval", "-c", str(setup["run"]), "--include-path", str(setup["tasks"])]
    assert main([*base, "--tasks", "glass_mcc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'glass_mcc'" in err and "glass_mc" in err
    assert "lm-eval ls tasks" in err
    assert main(["eval", "-c", str(setup["run"]), "--limit", "3"]) == 2
    assert "--limit goes with --tasks" in capsys.readouterr().err
    gone = tmp_path / "gone.jsonl"  # a task whose data file is missing
    yaml = (setup["tasks"] / "glass_mc.yaml").read_text(encoding="utf-8")
    yaml = yaml.replace("glass_mc", "glass_gone").replace(
        str(setup["tasks"].parent / "data" / "glass_gone.jsonl"), str(gone)
    )
    (tmp_path / "glass_gone.yaml").write_text(yaml, encoding="utf-8")
    assert main(["eval", "-c", str(setup["run"]), "--tasks", "glass_gone", "--include-path",
                 str(tmp_path)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data could not be read" in err and "gone.jsonl" in err


def test_missing_lm_eval_names_the_extra(setup, capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))  # fmt: skip
    assert main(["eval", "-c", str(setup["run"]), "--tasks", "glass_mc"]) == 2
    assert "pip install 'glassgpt[eval]'" in capsys.readouterr().err


def test_rolling_windows_match_the_harness_utils() -> None:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from glassgpt.sample.harness import rolling_windows

    for n in range(0, 40):
        for n_ctx in (1, 2, 5, 8):
            ids = list(range(n))
            want = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=ids, prefix_token=-1, max_seq_len=n_ctx, context_len=1)]  # fmt: skip
            assert rolling_windows(ids, -1, n_ctx) == want
