"""``glassgpt sae label``: against glassgpt's own server (a real OpenAI-compatible endpoint on a
tiny random model: its answers are gibberish, the test checks the machinery), against a small
HTTP answerer that knows the truth (perfect, always "no", inverted, unreadable: detection 1,
0.5, 0 and 0), and against endpoints that fail (refused, HTTP 500, too slow)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import string
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from tests.serve.conftest import start_server

from glassgpt.checkpoint import load, open_run
from glassgpt.cli import main
from glassgpt.data import DataDir
from glassgpt.errors import GlassError
from glassgpt.features.identity import KEY, model_identity
from glassgpt.features.label_client import Endpoint, EndpointError
from glassgpt.features.label_contexts import quiet_contexts
from glassgpt.features.label_job import label_feature
from glassgpt.features.label_prompts import parse_answers
from glassgpt.features.labels import key, read_labels, write_labels
from glassgpt.features.pages import load_pages
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.model import GPT, GPTConfig
from glassgpt.serve.app import create_app
from glassgpt.serve.features import load_sae
from glassgpt.tokenizer import CharTokenizer
from glassgpt.tokenizer.display import token_texts

# -- an answerer that knows which contexts hold the feature ------------------------------------


def answerer(
    policy: Callable[[list[str]], str], delay: float = 0.0, status: int = 200, busy: int = 0
) -> Any:
    """A stdlib HTTP server with OpenAI's two routes; a detection question is answered by
    ``policy`` (the numbered excerpts → the reply), an explanation by "Explanation: …"."""
    asked: list[str] = []
    refused: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, code: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200, {"object": "list", "data": [{"id": "oracle", "object": "model"}]})

        def do_POST(self) -> None:
            doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay)
            if len(refused) < busy:  # a rate limit: come back in a moment
                refused.append(1)
                self.send_response(429)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if status != 200:
                self._send(status, {"error": {"message": "the answerer is down", "type": "server_error"}})  # fmt: skip
                return
            ask = doc["messages"][-1]["content"]
            asked.append(ask)
            excerpts = re.findall(r"^\d+\. (.*)$", ask, re.M)
            reply = policy(excerpts) if "described as" in ask else "Explanation: the letter X"
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})  # fmt: skip

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda *a: None  # a client that timed out and left: nothing to print
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()
    server.asked = asked  # type: ignore[attr-defined]
    return server


def url_of(server: Any) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


TOPS = [(["a", "X", "b"], [0.0, 2.0 - k / 10, 0.0]) for k in range(10)]  # the feature: "X"
QUIET = [["a", "b", str(k)] for k in range(10)]

POLICIES = {
    "perfect": (lambda ex: json.dumps([int("X" in e) for e in ex]), 1.0, 0),
    "always no": (lambda ex: "[" + ", ".join("no" for _ in ex) + "]", 0.5, 0),
    "inverted": (
        lambda ex: "\n".join(f"{n}: {'no' if 'X' in e else 'yes'}" for n, e in enumerate(ex, 1)),
        0.0,
        0,
    ),
    "unreadable": (lambda ex: "I would rather not say.", 0.0, 10),
}


@pytest.mark.parametrize("name", POLICIES)
def test_detection_of_known_answerers(name: str) -> None:
    policy, score, unread = POLICIES[name]
    server = answerer(policy)
    try:
        entry = label_feature(Endpoint(url_of(server), "oracle"), TOPS, QUIET, explain=4, holdout=5, seed=1)  # fmt: skip
    finally:
        server.shutdown()
    assert entry["label"] == "the letter X"
    assert entry["detection"] == score and entry["unread"] == unread
    assert (entry["activating"], entry["silent"], entry["explained_by"]) == (5, 5, 4)
    explain, detect = server.asked
    assert explain.count("<<X>>") == 4  # the explaining contexts, marked
    assert "<<" not in detect and detect.count("X") == 5 + 1  # plain held-out ones (+ the label)


def test_a_busy_endpoint_is_asked_again() -> None:
    server = answerer(POLICIES["perfect"][0], busy=2)
    try:
        entry = label_feature(Endpoint(url_of(server), "oracle"), TOPS, QUIET, explain=4, holdout=5, seed=1)  # fmt: skip
    finally:
        server.shutdown()
    assert entry["detection"] == 1.0 and len(server.asked) == 2


@pytest.mark.parametrize(("answer", "n", "read"), [
    ("```json\n[1, 0, 1]\n```", 3, [True, False, True]),
    ("[yes, no] ... on second thought [no, yes]", 2, [False, True]),
    ('["true", "false"]', 2, [True, False]),
    ("Excerpt 1: yes\nExcerpt 2: no", 2, [True, False]),
    ("<think>maybe [1, 1]</think>\n[0, 1]", 2, [False, True]),
    ("<think>[1, 1] and then I ran out of tokens", 2, [None, None]),
    ("[1, 0, 2]", 3, [None, None, None]),
    ("", 1, [None]),
])  # fmt: skip
def test_answers_are_read_or_counted_unread(answer: str, n: int, read: list[Any]) -> None:
    assert parse_answers(answer, n) == read


# -- the command against glassgpt serve ---------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """glassgpt serve over a tiny random model that can read any printable text."""
    tok = CharTokenizer(sorted(set(string.printable)), special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=1024, d_model=32, n_layers=1, n_heads=2, positional="rope")  # fmt: skip
    app = create_app(GPT(cfg).eval(), tok, name="tiny-llm", slots=4)
    server, thread, url = start_server(app)
    yield url + "/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def sae_dir(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random SAE on the token embedding (f depends on the token alone, which lets the test
    check a silent context without the model) and its pages."""
    model, _ = load(tiny_run)
    sae = SAE(SAEConfig(d_in=model.config.d_model, d_sae=12, arch="relu", hook="embed"), seed=0)
    with torch.no_grad():  # x·W_enc ~ N(0, 1) over the vocabulary; thresholds from 0.3 to 1.6
        gen = torch.Generator().manual_seed(0)
        sae.W_enc.copy_(torch.randn(sae.W_enc.shape, generator=gen) / (model.embed.W_E.std() * model.config.d_model**0.5))  # fmt: skip
        sae.b_enc.copy_(-torch.linspace(0.3, 1.6, 12))
    out = tmp_path_factory.mktemp("label") / "sae"
    ident = {KEY: model_identity(open_run(tiny_run))}  # the model it reads, checked (no note)
    sae.save(out, extra={"model": str(tiny_run), "data": str(tiny_run / "data"), **ident})
    assert main(["sae", "features", "-c", str(out), "--tokens", "2000", "--seq-len", "32",
                 "--top", "8", "--context", "4", "2"]) == 0  # fmt: skip
    return out


def test_silent_contexts_are_silent(tiny_run: Path, sae_dir: Path) -> None:
    model, _ = load(tiny_run)
    sae = SAE.load(sae_dir).eval()
    stream = DataDir.open(tiny_run / "data").stream("train")
    feats = list(range(12))
    quiet = quiet_contexts(model, sae, stream, feats, n=5, width=(4, 2), seq_len=32, tokens=2000, seed=3)  # fmt: skip
    again = quiet_contexts(model, sae, stream, [7, 2], n=5, width=(4, 2), seq_len=32, tokens=2000, seed=3)  # fmt: skip
    assert again == {7: quiet[7], 2: quiet[2]}  # a feature's picks do not depend on the others
    pages = load_pages(sae_dir)
    found = 0
    for i in feats:
        for ids in quiet[i]:
            assert len(ids) == 7
            f = sae.encode(model.embed.W_E.detach()[torch.tensor(ids)])[
                :, i
            ]  # the oracle: f(token)
            assert torch.all(f == 0), (i, ids)
            found += 1
        if float(pages.density[i]) < 0.05:  # rare: silent places abound
            assert len(quiet[i]) == 5
    assert found > 0


def test_sae_label_against_glassgpt_serve(tiny_run: Path, sae_dir: Path, llm: str, capsys: Any) -> None:  # fmt: skip
    pages = load_pages(sae_dir)
    live = [i for i in range(8) if int(pages.count[i]) > 0]
    args = ["sae", "label", str(sae_dir), "--endpoint", llm, "--contexts", "3", "--holdout", "2",
            "--concurrency", "3"]  # fmt: skip
    assert main([*args, "--features", "0-3"]) == 0
    first = read_labels(sae_dir)
    assert sorted(first, key=int) == [str(i) for i in live if i <= 3]
    for entry in first.values():
        assert isinstance(entry["label"], str)
        assert 0.0 <= entry["detection"] <= 1.0
    for i in first:  # a dense feature may find no silent context in the random windows
        e = first[i]
        assert e["activating"] == 2 and e["silent"] == (2 if pages.density[int(i)] < 0.05 else e["silent"]) <= 2  # fmt: skip
        assert 0 <= e["unread"] <= e["activating"] + e["silent"]
    doc = json.loads((sae_dir / "labels.json").read_text())
    assert doc["model"] == "tiny-llm" and doc["endpoint"] == llm and doc["date"]
    out = capsys.readouterr().out
    assert f"{len(first)} features labelled" in out and "labels.json" in out
    # resumable: the labelled ones are skipped, the rest asked
    assert main([*args, "--features", "0-7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len([i for i in live if i > 3])} features labelled") and f"skipped: {len(first)} labelled before" in out  # fmt: skip
    both = read_labels(sae_dir)
    assert sorted(both, key=int) == [str(i) for i in live]
    assert all(both[k] == first[k] for k in first)
    assert main([*args, "--features", "0-7"]) == 0
    assert capsys.readouterr().out.startswith(
        f"0 features labelled; skipped: {len(live)} labelled before"
    )
    # -c DIR, as sae features takes it, is the same folder
    assert main(["sae", "label", "-c", *args[2:], "--features", "0-7"]) == 0
    assert capsys.readouterr().out.startswith("0 features labelled")
    assert main(["sae", "label", *args[2:], "-c", str(sae_dir)]) == 2
    assert "name the SAE folder once" in capsys.readouterr().err
    # the explorer's page shows the label
    model, tok = load(tiny_run)
    page = load_pages(sae_dir).page(live[0], token_texts(tok, range(model.config.n_vocab)))
    assert page["label"]["label"] == both[str(live[0])]["label"]


# -- bad input ----------------------------------------------------------------------------------


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_endpoint_that_does_not_answer(sae_dir: Path, capsys: Any) -> None:
    args = ["sae", "label", str(sae_dir), "--features", "0-11", "--overwrite"]
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    down, slow = answerer(lambda ex: "", status=500), answerer(lambda ex: "[]", delay=2.0)
    try:
        for endpoint, extra, says in ((dead, [], "does not answer"),
                                      (url_of(down), [], "answered HTTP 500 (the answerer is down)"),
                                      (url_of(slow), ["--timeout", "0.3"], "no answer within 0.3 s")):  # fmt: skip
            assert main([*args, "--endpoint", endpoint, *extra]) == 2
            err = capsys.readouterr().err
            assert endpoint in err and says in err, err
            assert err.strip().splitlines()[-1].startswith("glassgpt: error: --endpoint")
            assert err.count("error") == 1 and "Traceback" not in err
    finally:
        down.shutdown()
        slow.shutdown()
    with pytest.raises(EndpointError, match="does not answer"):
        Endpoint(dead, "m", timeout=1).chat([{"role": "user", "content": "hi"}], max_tokens=1)


@pytest.mark.parametrize(
    ("make", "extra", "says"),
    [
        (lambda d, s: d / "missing", [], "no such folder"),
        (lambda d, s: d, [], "not an SAE, transcoder or CLT folder"),
        # a CLT folder is labelled as an SAE's is (tests/features/test_clt_everywhere.py): from its pages
        (
            lambda d, s: (d / "clt.json").write_text("{}") and d,
            [],
            "no feature pages (make them with glassgpt sae features)",
        ),
        (
            lambda d, s: s,
            ["--features", "0-12"],
            "--features 0-12: 0-12 is out of range (this dictionary has features 0-11)",
        ),
        (lambda d, s: s, ["--features", "3,x"], "--features 3,x: not ids or ranges"),
        (lambda d, s: s, ["--contexts", "0"], "--contexts: must be ≥ 1, got 0"),
        (
            lambda d, s: s,
            ["--api-key-env", "GLASSGPT_TEST_NO_SUCH_VAR"],
            "GLASSGPT_TEST_NO_SUCH_VAR: that environment variable is not set",
        ),
        (lambda d, s: s, ["--endpoint", "localhost:8000"], "not an http(s) URL"),
    ],
)
def test_bad_input_is_one_line(make: Any, extra: list[str], says: str, sae_dir: Path, tmp_path: Path, capsys: Any) -> None:  # fmt: skip
    folder = make(tmp_path, sae_dir)
    args = ["sae", "label", str(folder), "--endpoint", "http://127.0.0.1:9/v1", "--overwrite", *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_folder_without_pages(tiny_run: Path, tmp_path: Path, capsys: Any) -> None:
    model, _ = load(tiny_run)
    SAE(SAEConfig(d_in=model.config.d_model, d_sae=4, arch="relu", hook="embed")).save(tmp_path / "s")  # fmt: skip
    assert main(["sae", "label", str(tmp_path / "s"), "--endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert "no feature pages (make them with glassgpt sae features)" in capsys.readouterr().err


# -- labels.json, and the explorer showing it ---------------------------------------------------


def test_the_labels_file(tmp_path: Path) -> None:
    assert read_labels(tmp_path) == {}
    one = {"label": "closing brackets", "detection": 0.9, "unread": 1}
    write_labels(tmp_path, {key(10): one, key(2): {"label": "x", "detection": None}}, model="m")
    write_labels(tmp_path, {key(3, layer=1): {"label": "y", "detection": 0.5}}, model="n")
    doc = json.loads((tmp_path / "labels.json").read_text())
    assert doc["model"] == "n" and list(doc["features"]) == ["1/3", "2", "10"]  # merged, in order
    back = read_labels(tmp_path)
    assert back["10"] == one and back["2"]["detection"] is None and back["1/3"]["label"] == "y"
    (tmp_path / "labels.json").write_text('{"features": {"1": {"detection": 1}}}')
    with pytest.raises(GlassError, match=r"labels\.json: not a labels file \(KeyError"):
        read_labels(tmp_path)


def test_the_explorer_shows_and_finds_labels(tiny_run: Path, sae_dir: Path, tmp_path: Path) -> None:
    model, tok = load(tiny_run)
    bare = tmp_path / "bare"
    shutil.copytree(sae_dir, bare)
    (bare / "labels.json").unlink(missing_ok=True)
    sae, pages = load_sae(str(bare), model)
    assert pages.page(0, token_texts(tok, range(model.config.n_vocab)))["label"] is None
    write_labels(bare, {"5": {"label": "Vowels After Spaces", "detection": 0.75}}, model="m")
    sae, pages = load_sae(str(bare), model)
    with TestClient(create_app(model, tok, sae=sae, pages=pages)) as client:
        page = client.get("/api/features/page/5").json()
        assert page["label"] == {"label": "Vowels After Spaces", "detection": 0.75}
        assert client.get("/api/features/page/4").json()["label"] is None
        found = client.post("/api/features/search", json={"query": "vowels after"}).json()
        assert found["results"][0] == {**found["results"][0], "id": 5, "why": "label",
                                       "label": "Vowels After Spaces"}  # fmt: skip
