"""Downloads that stream under ASGI too.

Under ASGI, Django collects a plain iterator (and so a FileResponse's file) into one list before
it sends a byte: a large download would sit whole in memory. These hand it an async iterator
instead, each chunk made in a worker thread, one chunk held at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, StreamingHttpResponse
from django.utils.http import content_disposition_header

CHUNK = 64 * 1024


def attachment(
    request: HttpRequest, chunks: Iterator[bytes], filename: str, content_type: str
) -> StreamingHttpResponse:
    body = one_at_a_time(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    # Whatever the file holds is never run or shown by the browser as a page.
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


def file_response(request: HttpRequest, f, **kwargs) -> FileResponse:
    """A FileResponse (its headers: length, name, type) that streams under ASGI too."""
    response = FileResponse(f, **kwargs)
    if isinstance(request, ASGIRequest):
        response.streaming_content = one_at_a_time(iter(lambda: f.read(CHUNK), b""), f.close)
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


async def one_at_a_time(chunks: Iterator[bytes], close=None) -> AsyncIterator[bytes]:
    """The chunks, each made in a worker thread (files are read and compressed there), so the
    event loop is never blocked and no more than one chunk is held at a time."""
    take = sync_to_async(next, thread_sensitive=False)
    done = object()
    try:
        while (chunk := await take(chunks, done)) is not done:
            yield chunk
    finally:
        closer = close or getattr(chunks, "close", None)
        if closer is not None:
            await sync_to_async(closer, thread_sensitive=False)()
