"""The body of an acl-serve request: read within --read-timeout, decoded from its Content-Encoding (gzip,
deflate), and refused past --max-body-bytes before, while and after it inflates."""
import asyncio
import zlib
from typing import Optional

from starlette.requests import ClientDisconnect, Request

from acl_runtime.scheduler import Closed
from acl_runtime.serve.protocol import BadRequest
from acl_runtime.serve.transport import STOPPING

ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "identity": None}
GZIP_MAGIC = b"\x1f\x8b"  # a gzip member's first bytes
TIMEOUT_AT = getattr(asyncio, "timeout_at", None)  # Python 3.11+; wait_for before


async def read_body(request: Request, limit: int, timeout: Optional[float] = None) -> bytes:
    """The body, decoded from its ``Content-Encoding`` (gzip, deflate); refused with 413 past ``limit`` bytes, by
    its Content-Length, as it streams in, and again as it decompresses (a bomb is refused by what it inflates
    to); 408 when it has not all arrived within ``timeout`` seconds of its headers (``--read-timeout``)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise BadRequest(415, f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or identity")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise BadRequest(413, f"the body is {length} bytes, over the limit of {limit} bytes (--max-body-bytes): "
                         "send fewer or shorter texts per request")
    inflate = None if ENCODINGS[encoding] is None else zlib.decompressobj(ENCODINGS[encoding])
    chunks, size, pending = [], 0, b""  # pending: a byte after a gzip member, too few to tell what follows
    async for chunk in _stream(request, timeout):
        if inflate is None:
            size += len(chunk)
            _check_size(size, limit, False)
            chunks.append(chunk)
            continue
        data, pending = pending + chunk, b""
        while data:
            if inflate.eof:  # a complete stream, and bytes after it: gzip's next member (RFC 1952 2.2), else refused
                if encoding == "gzip" and len(data) < len(GZIP_MAGIC) and GZIP_MAGIC.startswith(data):
                    pending = data
                    break
                if encoding != "gzip" or not data.startswith(GZIP_MAGIC):
                    raise BadRequest(400, f"the body has bytes after its {encoding} data: send the compressed "
                                     "stream alone")
                inflate = zlib.decompressobj(ENCODINGS[encoding])
            try:
                out = inflate.decompress(data, limit + 1 - size)
            except zlib.error as e:
                raise BadRequest(400, f"the body is not valid {encoding} data ({e})") from None
            size = limit + 1 if inflate.unconsumed_tail else size + len(out)  # a tail: more would come out
            _check_size(size, limit, True)
            chunks.append(out)
            data = inflate.unused_data if inflate.eof else b""
    if inflate is not None and (pending or not inflate.eof):
        raise BadRequest(400, f"the body is not valid {encoding} data (it ends before the compressed stream does)")
    return b"".join(chunks)


def _check_size(size: int, limit: int, decompressed: bool) -> None:
    if size > limit:
        raise BadRequest(413, f"the body is over the limit of {limit} bytes (--max-body-bytes"
                         f"{', decompressed' if decompressed else ''}): send fewer or shorter texts per request")


async def _stream(request: Request, timeout: Optional[float]):
    """The body's chunks, the whole within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    chunks = request.stream().__aiter__()
    while True:
        try:
            if deadline is None:
                chunk = await chunks.__anext__()
            elif TIMEOUT_AT is not None:  # a timer a chunk, no task (wait_for wraps each read in one)
                async with TIMEOUT_AT(deadline):
                    chunk = await chunks.__anext__()
            else:
                chunk = await asyncio.wait_for(chunks.__anext__(), max(deadline - loop.time(), 0))
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise BadRequest(408, f"the request's body did not all arrive within {timeout:g} s (--read-timeout); "
                             "send it at once") from None
        except ClientDisconnect:
            if request.scope.get(STOPPING):  # the drain started: the connection was answered 503 (transport.py)
                raise Closed("the server is stopping: the request's body was still arriving") from None
            raise BadRequest(408, "the client closed the connection before its body was read") from None
        yield chunk


async def disconnected(request: Request) -> None:
    """Returns once the client has closed its connection (its whole body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
