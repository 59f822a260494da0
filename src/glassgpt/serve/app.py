"""The web app: the OpenAI-compatible API, the explorer's JSON and its page, on one server.

    app = create_app(model, tokenizer, name="my-model", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)

The scheduler thread starts with the app and stops with it. With ``api_key``, every
``/v1`` and ``/api`` request (but ``/api/info``, which the page reads first) needs
``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from glassgpt.sample.steering import steering_hooks
from glassgpt.serve import api, errors, explore, features, graphs
from glassgpt.serve.errors import APIError
from glassgpt.serve.scheduler import Scheduler
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.chat import PLAIN

STATIC = resources.files("glassgpt.serve") / "static"


def create_app(
    model: Any,
    tokenizer: Any,
    *,
    name: str = "glassgpt",
    api_key: str | None = None,
    slots: int = 16,
    steer: Sequence[Any] = (),
    source: Path | None = None,
    sae: Any = None,
    pages: Any = None,
    chat: Any = PLAIN,
    max_context: int | None = None,
    transcoders: Any = None,
    graph_files: dict[str, Path] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``model`` (in eval mode) with ``tokenizer``; ``steer``
    (``glassgpt.sample.steering.Steer``s) steers every request's generation; ``source`` (the
    checkpoint or run folder served) gives the explorer's checkpoint slider its steps; ``sae``
    (and its ``pages``) adds the feature endpoints of ``glassgpt.serve.features``; ``chat``
    renders ``/v1/chat/completions``' messages (:mod:`glassgpt.tokenizer.chat`: a model's
    ``ChatTemplate``, ``PLAIN``, or None for a 400 naming the missing template);
    ``max_context`` is the server's context (``glassgpt.serve.slots.served_context``);
    ``transcoders`` (``features.replacement.Transcoders``) and ``graph_files`` (name → a
    graph.json) add the Graph tab's endpoints (``glassgpt.serve.graphs``)."""
    if tokenizer is None:
        raise APIError(500, "serving needs a tokenizer")
    model.eval()
    hooks = steering_hooks(model, steer)  # (a bad vector or name raises here, not per request)
    scheduler = Scheduler(model, tokenizer, slots=slots, steering=hooks, max_context=max_context)
    state = ServeState(model, tokenizer, name, scheduler, api_key, source=source, chat=chat)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            scheduler.close()

    app = FastAPI(title="glassgpt serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.glassgpt = state
    errors.install(app)

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "a wrong or missing API key (send Authorization: Bearer KEY)",
                           type="authentication_error", code="invalid_api_key")  # fmt: skip

    guard = [Depends(check_key)]
    app.include_router(api.make_router(state), dependencies=guard)
    app.include_router(explore.make_router(state, guard))
    app.include_router(features.make_router(state, guard, sae, pages))
    app.include_router(graphs.make_router(state, guard, transcoders, graph_files))
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> RedirectResponse:
        return RedirectResponse("/static/favicon.svg")

    return app
