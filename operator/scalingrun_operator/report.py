"""Training report: loss and accuracy curves per epoch with the best (early-stopping) epoch marked,
as a PNG and a Markdown page, drawn from the trainer's progress document of any run."""

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

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
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
    figure.suptitle(f"ScalingRun {run_name}: {progress.get('processes')} processes, effective batch "
                    f"{progress.get('effectiveBatchSize')}, learning rate {progress.get('learningRate'):g}")
    figure.tight_layout()
    png = out_dir / f"{run_name}-report.png"
    figure.savefig(png, dpi=100)
    plt.close(figure)

    columns = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "imagesPerSecond"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for h in history:
        cells = [str(h["epoch"])] + [f"{h.get(c, float('nan')):.4f}" for c in columns[1:-1]] + [
            f"{h.get('imagesPerSecond', float('nan')):.0f}"]
        rows.append("| " + " | ".join(cells) + (" **best**" if h["epoch"] == best else "") + " |")
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
    ])
    md = out_dir / f"{run_name}-report.md"
    md.write_text(markdown)
    return png, md
