"""Training report: loss and accuracy curves per epoch with the best (early-stopping) epoch marked,
as a PNG and a Markdown page, drawn from the trainer's progress document of any run. With
batchSizePerWorker: auto, also the probe's images/s per batch size with the chosen knee; per epoch,
the input-wait share and GPU utilisation when the trainer measured them. For an elastic run whose status is given
(`kubectl get scalingrun NAME -o yaml` as the -f file), the worker count over time as a step plot with each resize's
window (from the loss to training again), and the hours at each size."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from scalingrun_api.models import Resize, SizeTime
from scalingrun_api.progress import BatchSizeProbe, Progress, ProgressState
from ..decide import time_at_size
from ..decide.status import parse_time


@dataclass(frozen=True)
class WorkersOverTime:
    """An elastic run's worker count over time and its hours at each size, read from its status."""

    steps: list[tuple[dt.datetime, int]]  # (moment, workers from then on), the last closing the plot
    sizes: list[SizeTime]  # status.training.elastic.sizes with the running size's time added
    resizes: list[Resize]
    gpus_per_worker: int


def workers_over_time(status: Optional[dict[str, Any]], gpus_per_worker: int,
                      now: dt.datetime) -> Optional[WorkersOverTime]:
    """From a run's status, as read from the cluster: None unless it is an elastic run's. A finished run's time
    ends at its completionTime, a running one's at `now`."""
    if not ((status or {}).get("training") or {}).get("elastic"):
        return None
    elastic = time_at_size.read(status["training"])
    ended = status.get("phase") in ("Succeeded", "Failed") and parse_time(status.get("completionTime"))
    until = ended or now
    steps = time_at_size.worker_steps(elastic, until)
    sizes = time_at_size.time_at_sizes(elastic, gpus_per_worker, until)
    if not steps and not sizes:
        return None
    return WorkersOverTime(steps, sizes, list(elastic.resizes), gpus_per_worker)


def render_report(progress: Progress, run_name: str, out_dir: Path,
                  workers: Optional[WorkersOverTime] = None) -> tuple[Path, Path]:
    """Writes <out_dir>/<run>-report.png and .md from a progress document (and an elastic run's worker count over
    time); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [entry.model_dump(by_alias=True, exclude_none=True) for entry in progress.history]
    if not history:
        raise ValueError("the progress document has no finished epoch yet")
    out_dir.mkdir(parents=True, exist_ok=True)
    epochs = [h["epoch"] for h in history]
    best = progress.best_epoch
    stopped_early = (progress.state == ProgressState.succeeded.value
                     and epochs[-1] < (progress.max_epochs or epochs[-1]))

    probe = progress.batch_size_probe
    panels = 2 + bool(probe) + bool(workers and workers.steps)
    figure, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    for axis, metric, title in ((axes[0], "loss", "Loss"), (axes[1], "accuracy", "Accuracy")):
        for key, style, label in ((metric, "o-", "training"), (f"val_{metric}", "s-", "validation")):
            values = [h.get(key) for h in history]
            if any(v is not None for v in values):
                axis.plot(epochs, values, style, label=label)
        if best:
            axis.axvline(best, color="green", linestyle="--", label=f"best epoch {best} (weights kept)")
        if stopped_early:
            axis.axvline(epochs[-1], color="red", linestyle=":", label=f"early stop at epoch {epochs[-1]}")
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.set_xticks(epochs)
        axis.grid(alpha=0.3)
        axis.legend()
    if probe:
        _draw_probe(axes[2], probe)
    if workers and workers.steps:
        _draw_workers(axes[-1], workers)
    figure.suptitle(f"ScalingRun {run_name}: {progress.processes} processes, effective batch "
                    f"{progress.effective_batch_size}, learning rate {progress.learning_rate:g}")
    figure.tight_layout()
    png = out_dir / f"{run_name}-report.png"
    figure.savefig(png, dpi=100)
    plt.close(figure)

    columns = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "imagesPerSecond"]
    inputs = {row.epoch: row.model_dump(by_alias=True, exclude_none=True) for row in progress.input_history}
    extra = [key for key in ("inputWaitFraction", "gpuUtilization") if any(key in row for row in inputs.values())]
    header = columns + [{"inputWaitFraction": "input wait", "gpuUtilization": "GPU %"}[key] for key in extra]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for h in history:
        # The marker belongs to the epoch (the row), not to the last column, whichever that is.
        cells = [str(h["epoch"]) + (" **best**" if h["epoch"] == best else "")] + [
            f"{h.get(c, float('nan')):.4f}" for c in columns[1:-1]] + [
            f"{h.get('imagesPerSecond', float('nan')):.0f}"]
        measured = inputs.get(h["epoch"], {})
        for key in extra:
            value = measured.get(key)
            cells.append("" if value is None else f"{value:.0%}" if key == "inputWaitFraction" else f"{value:.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    best_metrics = progress.best_metrics
    markdown = "\n".join([
        f"# ScalingRun {run_name}",
        "",
        f"State: **{progress.state}** after {epochs[-1]} of {progress.max_epochs} epochs"
        + (" (early stopping)" if stopped_early else "") + ".",
        f"Best epoch: **{best}**, validation accuracy **{best_metrics.get('val_accuracy', float('nan')):.4f}**, "
        f"validation loss {best_metrics.get('val_loss', float('nan')):.4f}.",
        f"Processes: {progress.processes}; effective batch {progress.effective_batch_size}; "
        f"learning rate {progress.learning_rate}; training time {progress.elapsed_seconds} s.",
        f"Model: `{progress.model_uri}`",
        "",
        f"![curves]({png.name})",
        "",
        *rows,
        "",
        *(_probe_lines(probe) if probe else []),
        *(_workers_lines(workers) if workers else []),
    ])
    md = out_dir / f"{run_name}-report.md"
    md.write_text(markdown)
    return png, md


def _draw_probe(axis, probe: BatchSizeProbe) -> None:
    measured = [row for row in probe.table if row.images_per_second is not None]
    axis.plot([row.batch_size for row in measured], [row.images_per_second for row in measured], "o-",
              label="images/s, one process")
    for row in probe.table:
        if row.out_of_memory:
            axis.axvline(row.batch_size, color="red", linestyle=":", label=f"out of memory at {row.batch_size}")
    if probe.chosen:
        axis.axvline(probe.chosen, color="green", linestyle="--", label=f"chosen {probe.chosen} (knee)")
    axis.set_xscale("log", base=2)
    sizes = [row.batch_size for row in probe.table]
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.set_title(f"Batch-size probe ({probe.seconds} s)")
    axis.set_xlabel("batch size per process")
    axis.grid(alpha=0.3)
    axis.legend()


def _probe_lines(probe: BatchSizeProbe) -> list[str]:
    """The auto batch size: what was tried, what was chosen, and what it cost."""
    lines = [
        "## Batch size (auto)",
        "",
        f"Chosen: **{probe.chosen}** per process, the smallest size within 5 % of the best images/s; "
        f"the probe took {probe.seconds} s and stopped at "
        f"{'out-of-memory' if probe.stopped_by == 'outOfMemory' else 'the ceiling'}.",
        "",
        "| batch size | images/s |",
        "|---|---|",
    ]
    for row in probe.table:
        rate = "out of memory" if row.out_of_memory else f"{row.images_per_second or float('nan'):.0f}"
        lines.append(f"| {row.batch_size} | {rate}" + (" **chosen**" if row.batch_size == probe.chosen else "")
                     + " |")
    return [*lines, ""]


def _hours_text(workers: WorkersOverTime) -> str:
    unit = "GPU" if workers.gpus_per_worker else "worker"
    return f"{unit}-hours " + ", ".join(
        f"{s.workers}: {(s.gpu_hours if workers.gpus_per_worker else s.worker_hours) or 0:.2f}" for s in workers.sizes)


def _draw_workers(axis, workers: WorkersOverTime) -> None:
    """The worker count as a step plot over hours since the run first trained; each resize's window shaded."""
    start = workers.steps[0][0]

    def hours(moment: dt.datetime) -> float:
        return (moment - start).total_seconds() / 3600

    axis.step([hours(m) for m, _ in workers.steps], [n for _, n in workers.steps], where="post", label="workers")
    shaded = False
    for resize in workers.resizes:
        lost, trained = parse_time(resize.lost_at), parse_time(resize.training_at)
        if lost and trained and trained >= start:
            axis.axvspan(hours(max(lost, start)), hours(trained), color="orange", alpha=0.3,
                         label=None if shaded else "resizing (loss to training again)")
            shaded = True
    counts = sorted({n for _, n in workers.steps})
    axis.set_yticks(range(0, counts[-1] + 1))
    axis.set_ylim(0, counts[-1] + 0.5)
    axis.set_title(f"Workers over time ({_hours_text(workers)})", fontsize=9)
    axis.set_xlabel("hours since the run first trained")
    axis.grid(alpha=0.3)
    axis.legend()


def _workers_lines(workers: WorkersOverTime) -> list[str]:
    """An elastic run: the hours at each size, then each resize with its cause and cost."""
    lines = ["## Workers over time (elastic)", "", f"The plot's last panel; {_hours_text(workers)}.", "",
             "| workers | hours at this size | worker-hours | GPU-hours |", "|---|---|---|---|"]
    for size in workers.sizes:
        gpu = size.gpu_hours
        lines.append(f"| {size.workers} | {size.seconds / 3600:.2f} | {size.worker_hours:.2f} | "
                     f"{'' if gpu is None else f'{gpu:.2f}'} |")
    if workers.resizes:
        lines += ["", "| resize | cause | lost at | training again at | cost (s) |", "|---|---|---|---|---|"]
        for resize in workers.resizes:
            cause = " ".join(resize.cause.replace("|", "/").split())[:160]
            cost = resize.cost_seconds
            lines.append(f"| {resize.from_} -> {resize.to} | {cause} | {resize.lost_at or ''} | "
                         f"{resize.training_at or ''} | {'' if cost is None else cost} |")
    return [*lines, ""]
