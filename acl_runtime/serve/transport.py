"""uvicorn's h11 HTTP protocol as acl-serve runs it (a module of its own: ``--workers`` processes unpickle uvicorn's
config, which names this class).

- TCP_NODELAY on every connection. asyncio sets it only on sockets whose ``proto`` is TCP, and the listening socket
  that uvicorn's workers receive is rebuilt with ``socket.fromfd`` and proto 0. Their answers (headers and body, two
  writes) then waited for Nagle's algorithm and the client's delayed ACK: 40 ms a request, so that 2 workers
  served half what 1 served.
- A read timeout for request headers (``--read-timeout``, read from ``config.acl_read_timeout``): a connection
  that opens, or starts a request, and has not completed its headers within it is answered 408 and closed (uvicorn
  waits for ever; its keep-alive timer only runs between requests). The body's own timeout is the app's
  (``body.read_body``).
- At drain start (SIGTERM) a connection with no request under way (idle, or not yet sent), or still sending its
  request's headers or body, is answered 503 with ``Retry-After`` and ``Connection: close`` (uvicorn closed it
  unanswered, and a request already sent was lost). Waiting for a body would hold the drain for up to
  ``--drain-seconds``. The close is gentle: the connection's write side is shut, what the client still sends is
  read and dropped for up to ``LINGER_SECONDS`` (closing with unread bytes resets it, and a reset can destroy the
  503 before the client reads it). A connection made after the drain started (``server_state.acl_draining``, set by
  :class:`acl_runtime.serve.stopping.Server`) is answered so at once: uvicorn tells each connection once.
- A request h11 cannot parse (a bad chunk size, two Content-Lengths, HTTP/1.1 without Host, a NUL in a header, a
  raw non-ASCII target, headers over h11's 16 kB) is answered in JSON like every other error (uvicorn: plain text
  ``Invalid HTTP request received.``), with h11's status (400, 431, 501) and its reason cut before any of the
  request's own bytes, and the connection closed.
"""
import json
import re
import socket
import sys

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

TIMEOUT_BODY = json.dumps({"error": "the request's headers did not arrive within --read-timeout; the connection is "
                           "closed"}).encode()
STOPPING_BODY = json.dumps({"error": "the server is stopping (SIGTERM): this request was not taken; retry it",
                            "error_type": "Overloaded"}).encode()
STOPPING_ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                   b"connection: close\r\ncontent-length: " + str(len(STOPPING_BODY)).encode() + b"\r\n\r\n" +
                   STOPPING_BODY)
STOPPING = "acl.stopping"  # set in a request's scope when the drain answered it 503 (the app counts a 503)
LINGER_SECONDS = 1.0
TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                  b"content-length: " + str(len(TIMEOUT_BODY)).encode() + b"\r\n\r\n" + TIMEOUT_BODY)


def bad_request(error) -> bytes:
    """The answer to a request h11 refused (``error``: its RemoteProtocolError)."""
    status = getattr(error, "error_status_hint", 400)
    status = status if status in (400, 413, 414, 431, 501) else 400
    cut = re.split(r"""\s*(?:b?['"]|[:{(\[])""", str(error or ""), maxsplit=1)[0].strip()[:80]  # none of its bytes
    reason = cut or "malformed"
    body = json.dumps({"error": f"the request is not valid HTTP/1.1 ({reason}); the connection is closed"}).encode()
    phrase = {400: b"Bad Request", 413: b"Content Too Large", 414: b"URI Too Long",
              431: b"Request Header Fields Too Large", 501: b"Not Implemented"}[status]
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (status, phrase, len(body)) + body)


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._headers_timer, self._refused = None, False
        super().connection_made(transport)
        if getattr(self.server_state, "acl_draining", False):
            # made after the drain's shutdown() of every connection (stopping.Server.shutdown): no one else
            # answers it, and a request it sends would be served and the connection then held open
            self.refuse()
            return
        self._arm()

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        timeout = getattr(self.config, "acl_read_timeout", None)
        if timeout and self._headers_timer is None:
            self._headers_timer = self.loop.call_later(timeout, self._headers_timed_out)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered 503 at shutdown: read and dropped until the client closes
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm()  # bytes of a request whose headers are not complete: its deadline runs from the first
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()  # idle until the next request's first byte: uvicorn's keep-alive timeout governs that
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused, called while its RemoteProtocolError is handled: JSON."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(bad_request(sys.exc_info()[1]))
            self.transport.close()

    def _headers_timed_out(self) -> None:
        self._headers_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.write(TIMEOUT_ANSWER)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's drain start: a request in flight is answered and the connection then closed; any other
        connection is answered 503 (:meth:`refuse`)."""
        if self._refused:
            return
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
            # still sending its body: never accepted; its handler sees a disconnect and counts a 503 (STOPPING)
            self.cycle.scope[STOPPING] = True
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self.refuse()
        elif self.cycle is None or self.cycle.response_complete:
            self.refuse()
        else:
            super().shutdown()

    def refuse(self) -> None:
        """503 with Retry-After, the write side shut, the client's bytes dropped until it closes (at most
        LINGER_SECONDS), then the close."""
        self._refused = True
        self._disarm()
        self._unset_keepalive_if_required()
        if self.transport.is_closing():
            return
        self.transport.write(STOPPING_ANSWER)
        if self.transport.can_write_eof():
            try:
                self.transport.write_eof()
            except OSError:  # the client reset the connection already: nothing to answer
                self.transport.close()
                return
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()
            return None
        return super().eof_received()
