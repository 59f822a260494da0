"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

Bad JSON, a field of the wrong type or out of range: 400 naming the field; a wrong or
missing API key: 401; an unknown model or path: 404. Anything unexpected is logged and
answered with a 500 in the same shape, never with a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("glassgpt.serve")


class APIError(Exception):
    """An error the client caused (or a server failure), answered as JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.param, self.code = type, param, code


def error_response(e: APIError) -> JSONResponse:
    body = {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(body, status_code=e.status, headers=headers)


def _validation(exc: RequestValidationError) -> APIError:
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg', '')}",
                        code="invalid_json")  # fmt: skip
    field = loc[0] if loc else None
    where = ".".join(loc) if loc else "the body"
    return APIError(400, f"{where}: {first.get('msg', 'invalid value')}", param=field,
                    code="invalid_value")  # fmt: skip


def install(app: FastAPI) -> None:
    """Route every error through :func:`error_response`."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation(exc))

    @app.exception_handler(HTTPException)
    async def http(_: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return error_response(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("internal error: %r", exc, exc_info=exc)
        return error_response(
            APIError(500, f"internal error ({type(exc).__name__})", type="server_error")
        )
