"""A live ``glassgpt serve`` on an ephemeral localhost port, over a tiny random checkpoint.

The checkpoint is written as the trainer writes one and loaded back with ``glassgpt.load``;
uvicorn runs the app in a background thread on a socket bound to 127.0.0.1:0 and is shut
down at the end of the session.
"""

from __future__ import annotations

import socket
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runs import write_run

from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set(string.ascii_letters + string.digits + " ,.:;!?'\n-"))
KEY = "test-key"
CHROMIUM = Path("/usr/bin/chromium")


def write_checkpoint(out: Path, model: GPT, tok: CharTokenizer) -> Path:
    """``out/ckpt/step_000001`` as ``glassgpt.train`` writes it."""
    return write_run(out, model, tok, steps=(1,), keep_last=1)


def tiny_run(folder: Path, positional: str = "learned", n_ctx: int = 64) -> Path:
    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=n_ctx, d_model=32, n_layers=2, n_heads=4,
                    positional=positional)  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init: peaked distributions, few near-ties
        for p in model.parameters():
            p.normal_(0.0, 0.25)
    return write_checkpoint(folder, model, tok)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium through Playwright; skipped without Playwright for Python or Debian's
    ``/usr/bin/chromium`` (browser downloads are not possible in CI)."""
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


def open_page(url: str, browser: Any, problems: list[str], width: int = 1400) -> Any:
    """The explorer at ``url`` (width × 900), once its first analysis is shown; script errors
    go to ``problems`` (a 400 the test asked for does not)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.on("console", lambda m: m.type == "error" and "status of 400" not in m.text
            and problems.append(m.text))  # fmt: skip
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(url + "/")
    page.wait_for_function(
        "() => document.querySelector('#status').textContent.includes('analysed')"
    )
    return page


@dataclass
class Server:
    url: str
    app: Any
    run: Path

    @property
    def scheduler(self) -> Any:
        return self.app.state.glassgpt.scheduler


def start_server(app: Any) -> tuple[Any, threading.Thread, str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    run = tiny_run(tmp_path_factory.mktemp("serve") / "tiny")
    model, tok = load(run)
    torch.set_num_threads(1)
    app = create_app(model, tok, name="tiny", slots=8)
    server, thread, url = start_server(app)
    yield Server(url, app, run)
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def oracle(live: Server) -> tuple[Any, Any]:
    """The same checkpoint loaded again, for ``glassgpt.sample.generate`` to compare with."""
    from glassgpt.checkpoint import load

    return load(live.run)


def request(
    url: str, path: str, body: Any = None, *, method: str = "POST", headers: Any = None
) -> tuple[int, Any]:
    """(status, parsed JSON) of one request by the standard library's client."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw.decode("utf-8", "replace")


def held(live: Any, n: int, start: Any) -> None:
    """Run ``start`` with the model locked until ``n`` requests wait for the scheduler, so
    that they are decoded together."""
    sched = live.scheduler
    with sched.lock:
        start()
        deadline = time.monotonic() + 30
        while sched.pending < n or sched.admitting is None:
            assert time.monotonic() < deadline, "the requests did not reach the scheduler"
            time.sleep(0.01)


def decoded_together(live: Any, run: Any, n: int, tries: int = 3) -> dict[int, Any]:
    """``run(i, out)`` for i < n on n threads, started under ``held``, until at least n - 1 of
    them were decoded in one step (the scheduler's ``widest``), at most ``tries`` times: the
    jobs that reach the scheduler first are admitted at once, the rest on the prompt thread,
    and on a loaded machine the first may end before the rest land. Returns the last try's
    ``out``; fails naming the widest step if no try decoded them together."""
    widest, live.scheduler.widest = live.scheduler.widest, 0
    seen = 0
    for _ in range(tries):
        out: dict[int, Any] = {}
        threads = [threading.Thread(target=run, args=(i, out)) for i in range(n)]
        live.scheduler.widest = 0
        held(live, n, lambda threads=threads: [t.start() for t in threads])
        for t in threads:
            t.join(60)
        seen = max(seen, live.scheduler.widest)
        if live.scheduler.widest >= n - 1:
            break
    live.scheduler.widest = max(widest, seen)
    assert seen >= n - 1, f"the requests were not decoded together (widest step {seen})"
    return out


class Collected:
    """The token ids the scheduler emits for each of ``n`` jobs, and a semaphore released as
    each one ends (``emit_to(i)``: job i's ``emit``)."""

    def __init__(self, n: int) -> None:
        self.outs: list[list[int]] = [[] for _ in range(n)]
        self.done = threading.Semaphore(0)

    def emit_to(self, i: int) -> Any:
        def emit(kind: str, payload: Any) -> None:
            if kind == "token":
                self.outs[i].append(payload[0])
            else:
                self.done.release()

        return emit

    def wait(self, timeout: float = 60) -> None:
        for _ in self.outs:
            assert self.done.acquire(timeout=timeout)
