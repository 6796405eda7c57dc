"""The one exception a request is refused with (both routes, every module of acl-serve)."""
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` with control characters written as escapes (a field name sent as "\\n" stays one line)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class BadRequest(Exception):
    """A request refused: ``status`` (4xx) and a one-line ``message`` (whatever of the request it quotes);
    ``kind`` is TEI's ``error_type``."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        message = one_line(message)
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
