"""Step-time models: map a scheduled batch to the seconds its forward pass takes."""

from __future__ import annotations


class FixedStepTime:
    """Every forward step takes the same time (a unit clock for reasoning in steps)."""

    def __init__(self, seconds: float = 0.01):
        if seconds <= 0:
            raise ValueError(f"step time must be > 0 s, got {seconds}")
        self.seconds = seconds

    def __call__(self, batch) -> float:
        return self.seconds
