"""The metric definitions of reports/METRICS.md, parsed: name -> unit, text, and the page anchor to link to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

METRICS_MD = Path(__file__).with_name("METRICS.md")

_BULLET = re.compile(r"^- ((?:`[^`]+`, )*`[^`]+`) \(([^)]*)\): (.*)$")


@dataclass(frozen=True)
class Metric:
    names: tuple[str, ...]  # qualified by the section's file: "summary.ttft_s.p50", "steps.time_s"
    unit: str
    text: str

    @property
    def anchor(self) -> str:
        return "m-" + self.names[0].replace(".", "-")


@dataclass(frozen=True)
class Section:
    namespace: str  # steps | requests | summary | run | figures
    title: str
    metrics: tuple[Metric, ...]


@cache
def load(path: Path = METRICS_MD) -> tuple[Section, ...]:
    """Sections in file order. Raises ValueError naming the line of a malformed bullet."""
    sections: list[tuple[str, str, list]] = []
    current: list | None = None
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("## "):
            title = line[3:].strip()
            sections.append((title.split(".")[0].split(":")[0].strip(), title, []))
        elif line.startswith("- ") and sections:
            m = _BULLET.match(line)
            if m is None:
                raise ValueError(f"{path.name}:{lineno}: expected '- `name` (unit): definition'")
            ns = sections[-1][0]
            names = tuple(f"{ns}.{n}" for n in re.findall(r"`([^`]+)`", m.group(1)))
            current = [names, m.group(2), m.group(3)]
            sections[-1][2].append(current)
        elif line.startswith("  ") and current is not None:
            current[2] += " " + line.strip()
        elif not line.strip():
            current = None
    return tuple(Section(ns, title, tuple(Metric(n, u, t) for n, u, t in items)) for ns, title, items in sections)


@cache
def index(path: Path = METRICS_MD) -> dict[str, Metric]:
    """Every qualified name (``summary.pools.kv.capacity``) -> its Metric."""
    return {name: m for s in load(path) for m in s.metrics for name in m.names}


def lookup(name: str) -> Metric:
    """The Metric for a qualified name; KeyError with a clear message if METRICS.md lacks it."""
    try:
        return index()[name]
    except KeyError:
        raise KeyError(f"{name} is not defined in reports/METRICS.md") from None
