"""The requests of xf serve as LibreTranslate's clients send them: a POST's fields from the query
string and a JSON, form-encoded or multipart body, each read within its size limit; hostile
bodies (too deep, too long a number) are a 400, never a 500. ``HttpError`` is every answer other
than 200.
"""

from __future__ import annotations

import json
from typing import Optional

from ..base.errors import XfError
from ..base.json_input import parse_json
from ..decode.translate import Stats, decode_input_line


class HttpError(Exception):
    """An answer other than 200: its status, its one-line message and extra headers."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


async def read_body(request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to be over ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdecimal():  # not isdigit: "²" is a digit int() refuses
            raise HttpError(400, f"Content-Length {length!r} is not a number")
        if int(length) > limit:
            raise HttpError(413, f"request body of {int(length):,} bytes is over the limit of {limit:,} (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body is over the limit of {limit:,} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def text_lines(text: str, stats: Stats) -> list[str]:
    """A text's lines as ``xf translate`` reads a file's: split at LF, a CR before it dropped,
    invalid UTF-8 (and lone surrogates) replaced by U+FFFD and counted."""
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8, then U+FFFD
    return [decode_input_line(line, i + 1, stats, "request") for i, line in enumerate(raw.split(b"\n"))]


def json_body(text: str):
    """A JSON body, or a 400 naming why not (json_input's refusals: nested too deeply, a number too
    long, not JSON)."""
    try:
        return parse_json(text, "the body")
    except XfError as e:
        raise HttpError(400, str(e)) from None


def shown(value) -> str:
    """A field's value for an error message: a scalar as JSON (cut at 40 characters), else its kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


async def disconnected(receive) -> None:
    """Returns once the client has closed the connection (the body is read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def form_fields(text: str) -> dict:
    """A form-encoded body (or a query string) as LibreTranslate reads one: a repeated q is a list,
    alternatives a number."""
    from urllib.parse import parse_qs

    fields = {k: v if k == "q" and len(v) > 1 else v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
    return numbers(fields)


def numbers(fields: dict) -> dict:
    """Form fields are strings: alternatives as the number it names (LibreTranslate's int()),
    glossary and server_glossary "false" or "true" as the boolean (a form cannot hold a list of pairs)."""
    if isinstance(fields.get("alternatives"), str) and fields["alternatives"].isdecimal():  # "²" isdigit, not int()
        fields["alternatives"] = int(fields["alternatives"])
    for key in ("glossary", "server_glossary"):
        if fields.get(key) in ("false", "true"):
            fields[key] = fields[key] == "true"
    return fields


async def request_fields(request, limit: int, info: dict) -> dict:
    """The fields of a POST as LibreTranslate takes them: the query string's, then the body's over
    them (JSON, form-encoded or multipart; an empty body: the query string's alone)."""
    raw_query = request.scope.get("query_string", b"")  # not request.url: it decodes as strict UTF-8 (a 500)
    query = form_fields(raw_query.decode("utf-8", errors="replace")) if raw_query else {}
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        return {**query, **await multipart_fields(request, limit)}
    body = await read_body(request, limit)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:  # as xf translate reads a line: the bad bytes become U+FFFD
        text = body.decode("utf-8", errors="replace")
        info["invalid_utf8_body"] = True
    if kind.startswith("application/x-www-form-urlencoded"):
        fields = form_fields(text)
        if text.lstrip().startswith(("{", "[")) and "q" not in fields:  # was "'q' is empty"
            raise HttpError(400, "the body is JSON, but its Content-Type is application/x-www-form-urlencoded: "
                                 "send it as application/json")
        return {**query, **fields}
    if not text.strip() and query:
        return query
    payload = json_body(text)
    if not isinstance(payload, dict):
        raise HttpError(400, "the body must be a JSON object with q, source and target")
    return {**query, **payload}


async def multipart_fields(request, limit: int) -> dict:
    """A multipart/form-data body's fields; a file's as {"filename": ..., "data": bytes} (the
    body's size checked as it is read; Starlette parses it with python-multipart)."""
    length = request.headers.get("content-length", "")
    if length.strip().isdecimal() and int(length) > limit:
        raise HttpError(413, f"request body of {int(length):,} bytes is over the limit of {limit:,} (--max-body-bytes)")
    try:
        form = await request.form(max_part_size=limit)
    except AssertionError:  # Starlette's way of saying python-multipart is not installed
        raise HttpError(400, "multipart bodies need python-multipart on the server: send JSON or form-encoded") from None
    except Exception as e:  # noqa: BLE001 - Starlette's MultiPartException and HTTPException(400) for a bad body
        raise HttpError(400, f"the multipart body cannot be read: {getattr(e, 'detail', e)}") from None
    fields: dict = {}
    size = 0
    for key, value in form.multi_items():
        if hasattr(value, "read"):  # an UploadFile
            data = await value.read()
            size += len(data)
            value = {"filename": value.filename or "", "data": data}
        else:
            size += len(value)
        if size > limit:
            raise HttpError(413, f"request body is over the limit of {limit:,} bytes (--max-body-bytes)")
        fields[key] = [*fields[key], value] if key == "q" and key in fields else value
    await form.close()
    return numbers(fields)
