"""Typed errors of the pools. Misuse raises instead of corrupting a free list."""


class PoolError(Exception):
    """A pool was used in a way SGLang's own pool would corrupt itself on (or assert on)."""


class DoubleFreeError(PoolError):
    pass


class OutOfMemoryError(RuntimeError):
    """An allocation failed even after eviction: SGLang raises RuntimeError("Out of memory") here."""


class MambaCapacityError(RuntimeError):
    """No mamba state slot left: SGLang asserts ("increase --mamba-full-memory-ratio")."""


class SizingError(ValueError):
    """A configuration SGLang would refuse (or OOM on); the message is one line naming the parameter."""
