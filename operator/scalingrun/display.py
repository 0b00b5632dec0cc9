"""What `Run.wait()` shows while it waits: the phase, epochs, ETA and images/s from the run's status, as a tqdm bar
where tqdm is installed (tqdm.auto: the notebook's own widget in Jupyter, text in a terminal), else a line per change."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any, Optional, Protocol, TextIO


class Display(Protocol):
    def update(self, status: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _eta(training: dict[str, Any], now: dt.datetime) -> Optional[str]:
    moment = training.get("estimatedCompletion")
    if not moment:
        return None
    try:
        left = dt.datetime.fromisoformat(str(moment).replace("Z", "+00:00")) - now
    except ValueError:
        return None
    seconds = max(0, int(left.total_seconds()))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def progress_text(name: str, status: dict[str, Any], now: dt.datetime) -> str:
    """`quickstart Training: epoch 3/10, 812 images/s, ETA 4m10s` (the parts the status has)."""
    training = status.get("training") or {}
    parts = []
    if training.get("epoch") is not None:
        most = training.get("maxEpochs")
        parts.append(f"epoch {training['epoch']}/{most}" if most else f"epoch {training['epoch']}")
    if isinstance(training.get("imagesPerSecond"), (int, float)):
        parts.append(f"{training['imagesPerSecond']:.0f} images/s")
    eta = _eta(training, now)
    if eta and status.get("phase") == "Training":
        parts.append(f"ETA {eta}")
    head = f"{name} {status.get('phase') or 'Pending'}"
    return f"{head}: {', '.join(parts)}" if parts else head


class LineDisplay:
    """One line on `stream` (sys.stderr as it is when the line is printed: a notebook's) each time the text changes."""

    def __init__(self, name: str, stream: Optional[TextIO] = None):
        self.name, self.stream, self.last = name, stream, None

    def update(self, status: dict[str, Any]) -> None:
        text = progress_text(self.name, status, dt.datetime.now(dt.timezone.utc))
        if text != self.last:
            self.last = text
            print(text, file=self.stream or sys.stderr, flush=True)

    def close(self) -> None:
        pass


class TqdmDisplay:
    """A bar over the epochs (its total maxEpochs once the status has it), the phase and figures beside it."""

    def __init__(self, name: str, tqdm: Any):
        self.name, self.bar = name, tqdm(total=None, desc=name, unit="epoch")

    def update(self, status: dict[str, Any]) -> None:
        training = status.get("training") or {}
        if training.get("maxEpochs") and self.bar.total != training["maxEpochs"]:
            self.bar.total = training["maxEpochs"]
        if isinstance(training.get("epoch"), int) and training["epoch"] != self.bar.n:
            self.bar.n = training["epoch"]
        text = progress_text(self.name, status, dt.datetime.now(dt.timezone.utc))
        self.bar.set_postfix_str(text[len(self.name) + 1:], refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class Silent:
    def update(self, status: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def choose_display(name: str, progress: bool) -> Display:
    if not progress:
        return Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return LineDisplay(name)
    return TqdmDisplay(name, tqdm)
