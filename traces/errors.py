"""The one error a trace loader raises: a one-line ``FILE:LINE: field 'X': what is wrong``."""

from __future__ import annotations

from pathlib import Path


class TraceFormatError(ValueError):
    def __init__(self, path: str | Path | None, line: int | None, field: str | None, problem: str):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.problem = problem
        where = self.path or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        what = problem if field is None else f"field {field!r}: {problem}"
        super().__init__(f"{where}: {what}".replace("\n", " "))


class RequestError(ValueError):
    """A Request built with inconsistent fields; ``field`` names the Request attribute."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"field {field!r}: {problem}")
