"""Training report: loss and accuracy curves per epoch with the best (early-stopping) epoch marked,
as a PNG and a Markdown page, drawn from the trainer's progress document of any run. With
batchSizePerWorker: auto, also the probe's images/s per batch size with the chosen knee; per epoch,
the input-wait share and GPU utilisation when the trainer measured them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render_report(progress: dict[str, Any], run_name: str, out_dir: Path) -> tuple[Path, Path]:
    """Writes <out_dir>/<run>-report.png and .md; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = progress.get("history") or []
    if not history:
        raise ValueError("the progress document has no finished epoch yet")
    out_dir.mkdir(parents=True, exist_ok=True)
    epochs = [h["epoch"] for h in history]
    best = progress.get("bestEpoch")
    stopped_early = progress.get("state") == "succeeded" and epochs[-1] < progress.get("maxEpochs", epochs[-1])

    probe = progress.get("batchSizeProbe") or None
    figure, axes = plt.subplots(1, 3 if probe else 2, figsize=(16.5 if probe else 11, 4.2))
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
    figure.suptitle(f"ScalingRun {run_name}: {progress.get('processes')} processes, effective batch "
                    f"{progress.get('effectiveBatchSize')}, learning rate {progress.get('learningRate'):g}")
    figure.tight_layout()
    png = out_dir / f"{run_name}-report.png"
    figure.savefig(png, dpi=100)
    plt.close(figure)

    columns = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "imagesPerSecond"]
    inputs = {row.get("epoch"): row for row in progress.get("inputHistory") or [] if isinstance(row, dict)}
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
    best_metrics = progress.get("bestMetrics") or {}
    markdown = "\n".join([
        f"# ScalingRun {run_name}",
        "",
        f"State: **{progress.get('state')}** after {epochs[-1]} of {progress.get('maxEpochs')} epochs"
        + (" (early stopping)" if stopped_early else "") + ".",
        f"Best epoch: **{best}**, validation accuracy **{best_metrics.get('val_accuracy', float('nan')):.4f}**, "
        f"validation loss {best_metrics.get('val_loss', float('nan')):.4f}.",
        f"Processes: {progress.get('processes')}; effective batch {progress.get('effectiveBatchSize')}; "
        f"learning rate {progress.get('learningRate')}; training time {progress.get('elapsedSeconds')} s.",
        f"Model: `{progress.get('modelUri')}`",
        "",
        f"![curves]({png.name})",
        "",
        *rows,
        "",
        *(_probe_lines(probe) if probe else []),
    ])
    md = out_dir / f"{run_name}-report.md"
    md.write_text(markdown)
    return png, md


def _draw_probe(axis, probe: dict[str, Any]) -> None:
    table = probe.get("table") or []
    measured = [row for row in table if row.get("imagesPerSecond") is not None]
    axis.plot([row["batchSize"] for row in measured], [row["imagesPerSecond"] for row in measured], "o-",
              label="images/s, one process")
    for row in table:
        if row.get("outOfMemory"):
            axis.axvline(row["batchSize"], color="red", linestyle=":", label=f"out of memory at {row['batchSize']}")
    if probe.get("chosen"):
        axis.axvline(probe["chosen"], color="green", linestyle="--", label=f"chosen {probe['chosen']} (knee)")
    axis.set_xscale("log", base=2)
    sizes = [row["batchSize"] for row in table]
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.set_title(f"Batch-size probe ({probe.get('seconds')} s)")
    axis.set_xlabel("batch size per process")
    axis.grid(alpha=0.3)
    axis.legend()


def _probe_lines(probe: dict[str, Any]) -> list[str]:
    """The auto batch size: what was tried, what was chosen, and what it cost."""
    lines = [
        "## Batch size (auto)",
        "",
        f"Chosen: **{probe.get('chosen')}** per process, the smallest size within 5 % of the best images/s; "
        f"the probe took {probe.get('seconds')} s and stopped at "
        f"{'out-of-memory' if probe.get('stoppedBy') == 'outOfMemory' else 'the ceiling'}.",
        "",
        "| batch size | images/s |",
        "|---|---|",
    ]
    for row in probe.get("table") or []:
        rate = "out of memory" if row.get("outOfMemory") else f"{row.get('imagesPerSecond', float('nan')):.0f}"
        lines.append(f"| {row.get('batchSize')} | {rate}" + (" **chosen**" if row.get("batchSize") == probe.get(
            "chosen") else "") + " |")
    return [*lines, ""]
