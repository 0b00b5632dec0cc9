"""What validation says about a spec: errors (the run is refused, one per bad field) and warnings (the run is valid
but may not do what its author meant)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidScalingRun(ValueError):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


@dataclass(frozen=True)
class SpecWarning:
    """A valid spec that may not mean what it says: `scalingrun validate` prints it, the operator posts it as a
    Warning Event with `reason` when the run starts."""

    reason: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
