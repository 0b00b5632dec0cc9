"""How long training waits for its input, and how busy the GPU is, per epoch.

Method: a sequential map placed after the pipeline's last prefetch runs inside the training step's own
get_next, so it stamps the moment a batch leaves the pipeline for the model (keras/input_clock.py). Keras
calls on_train_batch_begin just before the step and on_train_batch_end once its results are on the host, so
per step: wait = arrival - begin (the step blocked on an empty prefetch buffer), step = end - begin.
The epoch's input-wait share is sum(wait) / sum(step) over its training steps (validation excluded;
the very first step, which traces the graph, too). Ranks wait for each other in the allreduce, so the
run reports the largest share over the ranks: one slow reader holds every rank back (combine_input_figures).

GPU utilisation is NVML's (PyPI nvidia-ml-py) busy percentage of this rank's GPU, sampled every half
second during the epoch; without GPUs there is no figure.

Diagnostic: SCALINGRUN_DIAGNOSTIC_READER_DELAY=SECONDS delays every training batch by that long before
the prefetch, making the reader deliberately slow (to see InputBound without a slow store).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Optional

from scalingrun_api.progress import InputEpoch

if TYPE_CHECKING:
    from .collective import Collective

READER_DELAY_ENV = "SCALINGRUN_DIAGNOSTIC_READER_DELAY"


class StepTimes:
    """Sums of input wait and step time over one epoch's training steps. Pure."""

    def __init__(self):
        self.wait = self.step = 0.0
        self.steps = 0

    def add(self, begin: float, arrival: Optional[float], end: float) -> None:
        """One step; an arrival outside [begin, end] is not this step's batch and is not counted."""
        if arrival is None or not begin <= arrival <= end:
            return
        self.wait += arrival - begin
        self.step += end - begin
        self.steps += 1

    def fraction(self) -> Optional[float]:
        return self.wait / self.step if self.step > 0 else None


class DelayedBatches:
    """This process's count of the training batches the diagnostic reader delay held (each rank its own): what a
    test of the delay asserts, where the wait it causes is the machine's load to hide."""

    count = 0

    @classmethod
    def hold(cls, seconds: float) -> float:
        cls.count += 1
        time.sleep(seconds)
        return 0.0

    @classmethod
    def report(cls) -> Optional[str]:
        return f"reader delay held {cls.count} training batches" if cls.count else None


def reader_delay() -> float:
    value = os.environ.get(READER_DELAY_ENV, "").strip()
    if not value:
        return 0.0
    try:
        delay = float(value)
    except ValueError:
        raise ValueError(f"{READER_DELAY_ENV} must be a number of seconds, got {value!r}") from None
    if delay < 0:
        raise ValueError(f"{READER_DELAY_ENV} must be >= 0, got {value!r}")
    return delay


def input_entry(epoch: int, wait_fraction: Optional[float], gpu_utilization: Optional[float]) -> InputEpoch:
    """One epoch of progress.json's inputHistory; absent figures stay None (and out of the document)."""
    return InputEpoch(epoch=epoch,
                      input_wait_fraction=None if wait_fraction is None else round(float(wait_fraction), 4),
                      gpu_utilization=None if gpu_utilization is None else round(float(gpu_utilization), 1))


def combine_input_figures(world: "Collective", wait: Optional[float],
                          gpu: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """All ranks (a collective): the largest input-wait share (the slowest reader holds every rank back) and the
    mean GPU utilisation over the ranks that have one."""
    (worst,) = world.allreduce([-1.0 if wait is None else wait], "max", name="input_wait_fraction")
    total, count = world.allreduce([gpu or 0.0, 0.0 if gpu is None else 1.0], "sum", name="gpu_utilization")
    return (worst if worst >= 0 else None), (total / count if count else None)


class GpuSampler:
    """Mean NVML utilisation of one GPU between start() and stop(), from a sampling thread."""

    def __init__(self, nvml, handle, interval: float = 0.5):
        self.nvml, self.handle, self.interval = nvml, handle, interval
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def open(cls, local_rank: int) -> Optional["GpuSampler"]:
        """This rank's GPU, or None where NVML or GPUs are absent."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if count < 1:
                return None
            index = physical_gpu_index(local_rank, count, os.environ.get("CUDA_VISIBLE_DEVICES"))
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError:
            return None

    def sample(self) -> float:
        return float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._samples.append(self.sample())
            except self.nvml.NVMLError:
                return

    def start(self) -> None:
        self.stop()
        self._samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
        self._thread.start()

    def stop(self) -> Optional[float]:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        if not self._samples:  # an epoch shorter than one interval: one reading now
            try:
                self._samples.append(self.sample())
            except self.nvml.NVMLError:
                return None
        return sum(self._samples) / len(self._samples)


def physical_gpu_index(local_rank: int, count: int, visible: Optional[str]) -> int:
    """NVML counts all GPUs; CUDA_VISIBLE_DEVICES (when it lists indexes) says which ones this process sees,
    and the trainer pins local rank r to the r-th visible one (modulo their number)."""
    if visible:
        indexes = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        if indexes:
            return indexes[local_rank % len(indexes)] % count
    return local_rank % count
