"""What a client is told when a request fails: 422 for a malformed request or question (`validation_error`,
`unprocessable`), 503 for a busy datastore or server (`busy`, `unavailable`), 507 for a full disk (`full`), each with
a detail that names no path on the server (`public`, and `public_name` for /health).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from bertknn.store.atomic import DiskFullError
from bertknn.store.datastore import DatastoreError
from bertknn.store.lock import BusyError
from bertknn.store.protocol import Store


def _encodable(value: object) -> str | int:
    """A location part or message that JSON in UTF-8 can carry: lone surrogates become backslash escapes."""
    return value if isinstance(value, int) else str(value).encode("utf-8", "backslashreplace").decode()


async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    """422 with each error's loc, msg and type only: the input and context FastAPI would echo may not be JSON
    (NaN, infinity) or not encodable (lone surrogates), which made its own handler fail with a 500."""
    errors = [
        {"loc": [_encodable(part) for part in e["loc"]], "msg": _encodable(e["msg"]), "type": _encodable(e["type"])}
        for e in err.errors()
    ]
    return JSONResponse({"detail": errors}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def public_name(name: str | Path) -> str:
    """A model or datastore as /health shows it: a path's last part only (relative or not), never where it lies on
    the server; a model hub name that is no local path stays as it is."""
    path = Path(name)
    return path.resolve().name if path.is_absolute() or path.exists() else str(name)


def public(message: str, store: Store) -> str:
    """An error message for a client: the datastore's directory (as given and absolute, and so its shards' and files'
    paths too) written as its name."""
    name = public_name(store.path)
    given = [str(store.path)] if len(store.path.parts) > 1 else []  # a bare name is shown as it is
    for path in sorted({str(store.path.resolve()), *given}, key=len, reverse=True):
        message = message.replace(path, name)
    return message


def unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=message)


def unavailable(message: str) -> HTTPException:
    """503 for a question the server could not answer now (busy, or a shard's node lost): a retry after Retry-After
    may get through."""
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=message, headers={"Retry-After": "5"})


def busy(err: BusyError, store: Store) -> HTTPException:
    """503 for a write that waited too long for another writer: a retry (after Retry-After) may get through."""
    return unavailable(public(str(err), store))


def full(err: DiskFullError, store: Store) -> HTTPException:
    """507 for a write the datastore's disk had no room for: nothing was changed, and a retry after space was freed
    finishes it."""
    return HTTPException(status.HTTP_507_INSUFFICIENT_STORAGE, detail=public(str(err), store))


@contextlib.contextmanager
def write_errors(store: Store, refused: int) -> Iterator[None]:
    """A write's errors as HTTP errors: BusyError 503, DiskFullError 507, another DatastoreError `refused` (409 for an
    add, 404 for a removal)."""
    try:
        yield
    except BusyError as err:
        raise busy(err, store) from None
    except DiskFullError as err:
        raise full(err, store) from None
    except DatastoreError as err:
        raise HTTPException(refused, detail=public(str(err), store)) from None
