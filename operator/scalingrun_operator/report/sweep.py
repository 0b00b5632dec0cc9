"""Sweep report: time per epoch and speedup against processes (with the ideal line), efficiency,
accuracy and worker-hours, as a PNG and a Markdown table, from the rows of a ScalingSweep: its
status.points (the operator's, or `scalingrun sweep --local`'s), or for `scalingrun report` the rows
read from its points' progress documents. Every row comes from decide.sweep.point_row."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from scalingrun_api.models import ScalingSweep
from ..schema.sweep import build_point_run, sweep_points
from ..schema.validation import parse_scalingrun
from ..builders.locations import progress_uri
from ..decide.sweep import document_row, scaling
from ..documents import parse_progress
from ..object_store import Clients, Store, read_json


def _feature_cache(row: dict[str, Any]) -> str:
    """The point's feature cache: its seconds when used, "off" when not, "-" when unknown."""
    if row.get("featureCache") is None:
        return "-"
    return f"{row.get('featureCacheSeconds') or 0:.0f} s" if row["featureCache"] else "off"


# (row key, Markdown heading, format or a function of the row)
COLUMNS = [
    ("workers", "workers", "{}"),
    ("processes", "processes", "{}"),
    ("effectiveBatchSize", "effective batch", "{}"),
    ("learningRate", "learning rate", "{:g}"),
    ("epochs", "epochs", "{}"),
    ("bestValAccuracy", "best val_accuracy", "{:.4f}"),
    ("bestValLoss", "val_loss", "{:.4f}"),
    ("wallSeconds", "wall s", "{:.0f}"),
    ("secondsPerEpoch", "s/epoch", "{:.1f}"),
    ("imagesPerSecond", "images/s", "{:.0f}"),
    ("speedup", "speedup", "{:.2f}"),
    ("efficiency", "efficiency", "{:.2f}"),
    ("workerHours", "worker-hours", "{:.3f}"),
    ("featureCache", "feature cache", _feature_cache),
]


def _cell(row: dict[str, Any], key: str, fmt) -> str:
    if callable(fmt):
        return fmt(row)
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def table_lines(rows: list[dict[str, Any]], markdown: bool = False) -> list[str]:
    """The sweep's table as Markdown or as aligned text for a terminal (same columns)."""
    header = [c[1] for c in COLUMNS]
    cells = [[_cell(r, key, fmt) for key, _, fmt in COLUMNS] for r in rows]
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(c) + " |" for c in cells]
    header = [h.replace(" ", "_") for h in header]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    return ["  ".join(h.rjust(w) for h, w in zip(header, widths))] + [
        "  ".join(v.rjust(w) for v, w in zip(c, widths)) for c in cells]


def render_sweep_report(rows: list[dict[str, Any]], sweep_name: str, out_dir: Path,
                        recommendation: Optional[dict[str, Any]] = None, threshold: float = 0.7,
                        note: str = "") -> tuple[Path, Path]:
    """Writes <out_dir>/<sweep>-sweep.png and .md; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("secondsPerEpoch")]
    if not timed:
        raise ValueError("no point of the sweep has finished yet")
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [r["processes"] for r in timed]
    base = timed[0]
    figure, axes = plt.subplots(1, 4, figsize=(17, 4.2))

    axis = axes[0]
    axis.plot(procs, [r["secondsPerEpoch"] for r in timed], "o-", label="measured")
    axis.plot(procs, [base["secondsPerEpoch"] * base["processes"] / p for p in procs], "k--", label="ideal (linear)")
    for r in timed:
        axis.annotate(f"{r['workerHours']:.3f} worker-h", (r["processes"], r["secondsPerEpoch"]),
                      textcoords="offset points", xytext=(4, 6), fontsize=8)
    axis.set_title("Time per epoch (s)")

    axis = axes[1]
    axis.plot(procs, [r.get("speedup") for r in timed], "o-", label="measured")
    axis.plot(procs, [p / base["processes"] for p in procs], "k--", label="ideal (linear)")
    axis.set_title(f"Speedup against {base['processes']} process(es)")

    axis = axes[2]
    axis.bar([str(p) for p in procs], [r.get("efficiency") or 0 for r in timed], color="tab:blue")
    axis.axhline(threshold, color="red", linestyle=":", label=f"threshold {threshold:g}")
    axis.set_ylim(0, max(1.1, *[(r.get("efficiency") or 0) + 0.1 for r in timed]))
    axis.set_title("Efficiency (speedup / scale)")

    axis = axes[3]
    axis.plot(procs, [r.get("bestValAccuracy") for r in timed], "s-", color="tab:green", label="best val_accuracy")
    axis.set_title("Accuracy")

    for axis in axes:
        axis.set_xlabel("processes")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in (axes[0], axes[1], axes[3]):
        axis.set_xticks(procs)
    if recommendation:
        for axis in (axes[0], axes[1], axes[3]):
            axis.axvline(recommendation["processes"], color="green", linestyle="--", alpha=0.5)
    title = f"ScalingSweep {sweep_name}"
    if recommendation:
        title += f": recommended {recommendation['workers']} worker(s), {recommendation['processes']} process(es)"
    figure.suptitle(title)
    figure.tight_layout()
    png = out_dir / f"{sweep_name}-sweep.png"
    figure.savefig(png, dpi=100)
    plt.close(figure)

    lines = [f"# ScalingSweep {sweep_name}", ""]
    if recommendation:
        count = recommendation["workers"]
        lines.append(f"Recommendation: **{count} worker{'' if count == 1 else 's'}** ({recommendation['run']}): "
                     f"{recommendation['message']}.")
    else:
        lines.append(f"No recommendation: no finished point has efficiency >= {threshold:g} and accuracy within "
                     "tolerance of the best.")
    if note:
        lines += ["", note]
    lines += ["", f"![sweep]({png.name})", "", *table_lines(rows, markdown=True), "",
              "speedup = the first point's seconds per epoch / this point's; efficiency = speedup / (processes / "
              "the first point's processes); worker-hours = processes x wall time.", ""]
    md = out_dir / f"{sweep_name}-sweep.md"
    md.write_text("\n".join(lines))
    return png, md


def rows_from_storage(sweep: ScalingSweep) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
    """The sweep's rows and recommendation from its points' progress documents (keys from the environment, as
    for any S3 client); StorageError when one cannot be read."""
    rows, clients = [], Clients()
    for point in sweep_points(sweep):
        run = parse_scalingrun(build_point_run(sweep, point))
        storage = run.spec.storage
        progress = parse_progress(read_json(progress_uri(run), Store(storage.endpoint, storage.region,
                                                                      clients=clients)))
        rows.append(document_row(point, progress))
    return scaling(sweep, rows)


def print_sweep(sweep_name: str, rows: list[dict[str, Any]], recommendation: Optional[dict[str, Any]],
                notes: list[str], threshold: float, out_dir: Path) -> None:
    """The table, the recommendation, the notes and the report's paths, on stdout."""
    print(f"\n== ScalingSweep {sweep_name} ==")
    print("\n".join(table_lines(rows)))
    if recommendation:
        print(f"recommended: {recommendation['message']}")
    else:
        print("recommended: none (no finished point qualifies)")
    for note in notes:
        print(note)
    try:
        png, md = render_sweep_report(rows, sweep_name, out_dir, recommendation, threshold, note="\n".join(notes))
    except ValueError as exc:
        print(f"no report: {exc}")
        return
    print(f"report: {png} and {md}")
