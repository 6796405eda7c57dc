"""uvicorn's h11 HTTP protocol with TCP_NODELAY on every connection (a module of its own: ``--workers`` processes
unpickle uvicorn's config, which names this class).

asyncio sets TCP_NODELAY only on sockets whose ``proto`` is TCP, and the listening socket that uvicorn's workers
receive is rebuilt with ``socket.fromfd`` and proto 0. Their answers (headers and body, two writes) then waited for
Nagle's algorithm and the client's delayed ACK: 40 ms a request, so that 2 workers served half what 1 served."""
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
