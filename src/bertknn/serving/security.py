"""What keeps the service safe to expose: request bodies limited (`BodyLimit`, 413), the Host header checked against
the names a bind answers (`is_loopback`, `allowed_hosts_for`, `host_patterns` for TrustedHostMiddleware), writes
refused unless the server is writable (403) and, with a token, unless the request bears it (401, compared in constant
time); and the messages that say so.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import socket
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
TOKEN_ENV = "BERTKNN_TOKEN"
READ_ONLY = "read-only datastore: start the server with `bertknn serve DIR --writable` to add or remove documents"
UNAUTHORIZED = (
    f"missing or wrong token: send the header `Authorization: Bearer TOKEN` with the token the server was started "
    f"with (`bertknn serve --token` or {TOKEN_ENV})"
)
BEARER = HTTPBearer(auto_error=False, description=f"the token given to `bertknn serve --token` or {TOKEN_ENV}")


def _error_response(err: HTTPException) -> JSONResponse:
    return JSONResponse({"detail": err.detail}, status_code=err.status_code, headers=err.headers)


class BodyTooLarge(HTTPException):
    """A request body over the limit (413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status.HTTP_413_CONTENT_TOO_LARGE, detail=f"request body over the limit of {max_bytes:,} bytes"
        )


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413, refused by its Content-Length before it is read,
    or as soon as a streamed (chunked) body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            await _error_response(BodyTooLarge(self.max_bytes))(scope, receive, send)
            return
        received, started = 0, False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)  # FastAPI answers it; otherwise the except below does
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLarge as err:
            if started:
                raise
            await _error_response(err)(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts_for(host: str) -> list[str]:
    """The Host names a server bound to `host` answers: the loopback names, plus for a network bind that address
    and this machine's names and addresses."""
    if is_loopback(host):
        return list(LOOPBACK_NAMES)
    names = {host, socket.gethostname(), socket.getfqdn()}
    with contextlib.suppress(OSError):
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return [*LOOPBACK_NAMES, *sorted(names - set(LOOPBACK_NAMES))]


def host_patterns(hosts: list[str]) -> list[str]:
    """`hosts` as TrustedHostMiddleware matches them: IPv6 literals in brackets, as they stand in a Host header."""
    return [f"[{h.strip('[]')}]" if ":" in h else h for h in hosts]


def write_checks(writable: bool, token: str | None) -> list:
    """The dependencies of a write route: 403 unless `writable`; with a `token`, first 401 unless the request sends
    `Authorization: Bearer <token>`."""
    if token is not None and not token:
        raise ValueError("the token must not be empty")
    expected = token.encode() if token else b""

    def require_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> None:
        given = credentials.credentials.encode("latin-1") if credentials else b""  # header bytes as sent
        if not hmac.compare_digest(given, expected):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
            )

    def require_writable() -> None:
        if not writable:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail=READ_ONLY)

    return [Depends(require_token), Depends(require_writable)] if token else [Depends(require_writable)]
