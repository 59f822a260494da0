"""The HTML report in a real browser: headless Chromium, driven over the DevTools protocol.

Chromium is started with ``--remote-debugging-pipe`` (commands on fd 3, replies on fd 4, JSON
separated by NUL bytes), so no network port and no extra Python package is needed. A page
passes when loading it raises no console error, no exception and no failed resource, and
every <img> decodes (naturalWidth > 0). A control page with a broken image, a console error
and an exception shows that the checks can fail.

Skipped when no ``chromium`` is installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.slow,
]


class Browser:
    """Headless Chromium with the DevTools protocol on a pipe."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        cmd_r, self.cmd_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.profile = tempfile.mkdtemp(prefix="glassgpt-chromium-")

        def fds() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            os.dup2(cmd_r, 3)
            os.dup2(resp_w, 4)

        self.proc = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            close_fds=False,
        )
        os.close(cmd_r)
        os.close(resp_w)
        self.buffer = b""

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read()
            if event.get("method") == method:
                return event
            self.events.append(event)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.resp_r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.resp_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.resp_r)
        shutil.rmtree(self.profile, ignore_errors=True)


def load_page(path: Path) -> dict[str, Any]:
    """Open ``path``; return its errors and how many of its images decoded."""
    browser = Browser()
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session)
        browser.send("Page.navigate", session, url=path.resolve().as_uri())
        browser.wait_for("Page.loadEventFired")
        check = (
            "JSON.stringify({n: document.images.length, ok: [...document.images]"
            ".filter(i => i.complete && i.naturalWidth > 0).length,"
            " sections: document.querySelectorAll('section').length,"
            " shrunk: [...document.images].filter(i => i.width < i.naturalWidth).length})"
        )
        value = browser.send("Runtime.evaluate", session, expression=check, returnByValue=True)
        counts = json.loads(value["result"]["value"])
        errors = []
        for event in browser.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                description = details.get("exception", {}).get("description", "")
                errors.append(f"exception: {details.get('text')} {description}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(
                    f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}"
                )
        return {**counts, "errors": errors}
    finally:
        browser.close()


def test_the_checks_catch_a_broken_page(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><img src='missing.png'><img src='data:image/png;base64,AAAA'>"
        "<script>console.error('boom'); undefinedFunction();</script></body></html>"
    )
    result = load_page(page)
    assert result["n"] == 2 and result["ok"] == 0
    text = " ".join(result["errors"])
    assert "boom" in text and "undefinedFunction" in text and "missing.png" in text


def test_report_loads_without_errors_and_shows_its_figures(
    tmp_path: Path, report_html: SimpleNamespace
) -> None:
    page = tmp_path / "report.html"
    page.write_text(report_html.html, encoding="utf-8")
    result = load_page(page)
    assert result["errors"] == []
    assert result["n"] == report_html.n_figures and result["ok"] == result["n"]
    assert result["sections"] >= 8
    assert result["shrunk"] == 0  # at their own size: 9 pt labels stay 11 px on screen
