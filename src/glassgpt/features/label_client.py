"""An OpenAI-compatible chat endpoint, spoken to with the standard library (``urllib``): the
two calls ``glassgpt sae label`` makes (``GET /models``, ``POST /chat/completions``), so the
labeller needs no HTTP package. Any server with the OpenAI API answers: glassgpt's own
``serve``, vLLM, Ollama (``http://localhost:11434/v1``), llama.cpp's server, or a hosted API
with its key.

Every failure to talk (refused, timed out, a non-200, a body that is not a chat completion)
is one line naming the URL (:class:`EndpointError`). A busy server (429, 503: a hosted API's
rate limit, a local one's full queue) is asked again after 1, 4 and 15 s, or after the
``Retry-After`` it sends, before that counts as a failure.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from glassgpt.errors import GlassError

BACKOFF = (1.0, 4.0, 15.0)  # seconds before each retry of a busy endpoint
MAX_WAIT = 60.0  # the longest Retry-After obeyed


class EndpointError(GlassError):
    """The endpoint did not answer as an OpenAI-compatible server does."""


def base_url(url: str) -> str:
    """The API's base (OpenAI's ``base_url``): ``url`` without a trailing ``/chat/completions``
    or slash, with ``/v1`` added to a bare host.

    >>> base_url("http://localhost:8000"), base_url("http://h:1/v1/chat/completions")
    ('http://localhost:8000/v1', 'http://h:1/v1')
    >>> base_url("https://api.example.com/openai/v1/")
    'https://api.example.com/openai/v1'
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise GlassError(f"--endpoint {url}: not an http(s) URL (e.g. http://localhost:8000/v1)")
    url = url.rstrip("/")
    url = url.removesuffix("/chat/completions")
    return url + "/v1" if not urlsplit(url).path else url


@dataclass(frozen=True)
class Endpoint:
    """``url`` (the API's base, :func:`base_url`), the ``model`` asked, an optional bearer
    ``api_key``, and the seconds one request may take."""

    url: str
    model: str | None = None
    api_key: str | None = None
    timeout: float = 120.0

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        where = f"--endpoint {self.url}"
        try:
            for wait in (*BACKOFF, None):
                try:
                    with urllib.request.urlopen(req, timeout=self.timeout) as r:
                        raw = r.read()
                    break
                except urllib.error.HTTPError as e:
                    # busy (429, 503): wait as it asks, within reason, then try again
                    if e.code not in (429, 503) or wait is None:
                        raise
                    asked = _retry_after(e)
                    time.sleep(min(wait if asked is None else asked, MAX_WAIT))
        except urllib.error.HTTPError as e:
            raise EndpointError(f"{where}: {path} answered HTTP {e.code} ({_reason(e)})") from None
        except (urllib.error.URLError, OSError) as e:  # refused, no such host, timed out
            reason = getattr(e, "reason", e)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                reason = f"no answer within {self.timeout:g} s"
            raise EndpointError(f"{where}: does not answer ({reason})") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise EndpointError(f"{where}: {path} answered something that is not JSON") from None

    def first_model(self) -> str:
        """The first model the server lists (``GET /models``)."""
        doc = self._request("/models")
        try:
            return str(doc["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"--endpoint {self.url}: /models lists no model; pass --model NAME") from None  # fmt: skip

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float = 0.0) -> str:  # fmt: skip
        """The reply's text to ``messages`` ("" when the server sent none)."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature}  # fmt: skip
        doc = self._request("/chat/completions", body)
        try:
            content = doc["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EndpointError(f"--endpoint {self.url}: /chat/completions answered without choices[0].message") from None  # fmt: skip
        return content if isinstance(content, str) else ""


def _reason(e: urllib.error.HTTPError) -> str:
    """The server's error message (OpenAI's ``{"error": {"message": …}}``), else its reason."""
    try:
        doc = json.loads(e.read() or b"null")
        msg = doc["error"]["message"] if isinstance(doc.get("error"), dict) else doc.get("detail") or doc["error"]  # fmt: skip
        return " ".join(str(msg).split())[:300]
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return str(e.reason)


def _retry_after(e: urllib.error.HTTPError) -> float | None:
    """The seconds of a ``Retry-After`` header (None: absent, or a date)."""
    try:
        return max(0.0, float(e.headers.get("Retry-After", "")))
    except (TypeError, ValueError):
        return None
