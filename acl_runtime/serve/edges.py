"""HTTP edges that uvicorn (h11) and Starlette get wrong, put right in front of the app (an ASGI middleware,
outermost) and in the HTTP protocol (:mod:`acl_runtime.serve.transport`); docs/serve.md, "HTTP edges".

- **An absolute-form target** (``POST http://host:port/predict HTTP/1.1``, what a client talking to a proxy sends;
  RFC 9112 3.2.2: a server MUST accept it) is routed by its path: uvicorn put the whole URL in ``path`` (404).
- **Content-Length together with Transfer-Encoding** is 400 and the connection closed (RFC 9112 6.3: handle as an
  error, and close; the precondition for request smuggling behind a proxy that frames by the other header). h11
  framed it by Transfer-Encoding and kept the connection open for the next request.
- **An encoded '/' (``%2F``) in the path** is 404: uvicorn decoded it before routing, so ``acl%2Fversions%2F1``
  was routed as ``acl/versions/1``.
- **Accept-Encoding's qvalues** (RFC 9110 12.5.3): Starlette's GZipMiddleware compresses when the header contains
  the letters ``gzip``, ``gzip;q=0`` included. Here the header the gzip middleware sees is ``gzip`` when the client
  accepts gzip (listed with q above 0, or not listed and ``*`` is) and removed otherwise.
"""
import json
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

ABSOLUTE = ("http://", "https://")


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip (RFC 9110 12.5.3; ``x-gzip`` is gzip)."""
    q: Dict[str, float] = {}
    for item in header.split(","):
        name, _, params = item.partition(";")
        name, value = name.strip().lower(), 1.0
        for param in params.split(";"):
            key, _, text = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    value = float(text.strip())
                except ValueError:
                    value = 0.0  # a qvalue that cannot be read is not an acceptance
                value = value if 0.0 <= value <= 1.0 else 0.0
        if name:
            q[name] = max(value, q.get(name, 0.0))
    for name in ("gzip", "x-gzip"):
        if name in q:
            return q[name] > 0
    return q.get("*", 0.0) > 0


def _headers(scope) -> List[Tuple[bytes, bytes]]:
    return scope.get("headers") or []


def _refuse(status: int, message: str):
    body = json.dumps({"error": message}).encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]},
            {"type": "http.response.body", "body": body}]


class Edges:
    """The ASGI middleware: outermost, so that the router, the gzip middleware and the handlers see the request
    as the RFCs have it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        names = [name for name, _ in _headers(scope)]
        if b"content-length" in names and b"transfer-encoding" in names:
            for message in _refuse(400, "the request has both Content-Length and Transfer-Encoding (RFC 9112 6.3): "
                                   "send one; the connection is closed"):
                await send(message)
            return
        if b"%2f" in (scope.get("raw_path") or b"").lower():
            # uvicorn decodes it before routing (acl%2Fversions%2F1 was routed as acl/versions/1); no route takes a
            # '/' inside a segment (a --model-name holds none)
            for message in _refuse(404, "no route: the path holds an encoded '/' (%2F) inside a segment"):
                await send(message)
            return
        path = scope.get("path", "")
        if path.startswith(ABSOLUTE):
            target = urlsplit(path)
            raw = scope.get("raw_path") or path.encode()
            scope = dict(scope, path=target.path or "/",
                         raw_path=urlsplit(raw.decode("latin-1")).path.encode("latin-1") or b"/")
        gzip = [value for name, value in _headers(scope) if name == b"accept-encoding"]
        if gzip:
            keep = accepts_gzip(b",".join(gzip).decode("latin-1"))
            scope = dict(scope, headers=[(n, v) for n, v in _headers(scope) if n != b"accept-encoding"] +
                         ([(b"accept-encoding", b"gzip")] if keep else []))
        await self.app(scope, receive, send)
