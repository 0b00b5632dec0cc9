"""What an engine's ranks share: its Collective (rank, world size, broadcast and all-reduce)."""

from __future__ import annotations

from typing import Any, Protocol


class Collective(Protocol):
    """An engine's communication between its ranks. Every rank calls each operation, in the same order."""

    rank: int
    size: int

    def broadcast(self, value: Any, name: str) -> Any:
        """Rank 0's `value` (a picklable object) on every rank."""

    def allreduce(self, values: list[float], op: str, name: str) -> list[float]:
        """Element-wise "max" or "sum" of every rank's `values`."""
