"""The one exception a request is refused with (both routes, every module of acl-serve)."""


class BadRequest(Exception):
    """A request refused: ``status`` (4xx) and a one-line ``message``; ``kind`` is TEI's ``error_type``."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
