"""What a telemetry reader says about input it cannot use: one error, or one skip count per reason.

``TelemetryError`` is raised for a file that is not what it claims to be (``FILE:LINE: field 'X': problem``, one
line, as ``traces.errors.TraceFormatError``). A record that is well formed but unusable for a step-time comparison
(an idle heartbeat, a decode line whose logging interval also ran prefills) is not an error: it is counted in
``Skips`` under its reason, with the first place it occurred.
"""

from __future__ import annotations

from pathlib import Path


class TelemetryError(ValueError):
    def __init__(self, path: str | Path | None, line: int | None, field: str | None, problem: str):
        self.path = None if path is None else str(path)
        self.line, self.field, self.problem = line, field, problem
        where = self.path or "<telemetry>"
        if line is not None:
            where = f"{where}:{line}"
        what = problem if field is None else f"field {field!r}: {problem}"
        super().__init__(f"{where}: {what}".replace("\n", " "))


class Skips:
    """reason -> count, and where each reason first occurred (``FILE:LINE``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def add(self, reason: str, path: str | Path, line: int | None) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.first.setdefault(reason, f"{path}:{line}" if line is not None else str(path))

    def merge(self, other: "Skips") -> None:
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            self.first.setdefault(reason, other.first[reason])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line per reason: ``N x reason (first at FILE:LINE)``."""
        return [f"{n} x {reason} (first at {self.first[reason]})"
                for reason, n in sorted(self.counts.items(), key=lambda kv: -kv[1])]
