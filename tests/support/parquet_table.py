"""A small labelled Parquet table written for the trainer's table input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scalingrun_trainer.preprocess.parquet_table import TableParams


SIDE = 32  # the smallest spec.dataset.imageSize


def write_table(root: Path, *, rows: int = 40, row_group_size: int = 5, image: str = "pixels", label: str = "y",
                side: int = SIDE, label_type=pa.int64(), image_type=None, labels=None, files: int = 1) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", rows), ("validation", rows // 2)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for index in range(files):
            pixels = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8).tobytes() for _ in range(count)]
            values = labels if labels is not None else [i % 3 for i in range(count)]
            table = pa.table({image: pa.array(pixels, image_type or pa.binary()),
                              label: pa.array(values[:count], label_type), "note": ["x"] * count})
            pq.write_table(table, root / split / f"part-{index}.parquet", row_group_size=row_group_size)
    return root


def params(root: Path, tmp_path: Path, **overrides) -> TableParams:
    return TableParams(**{"source": str(root), "output": str(tmp_path / "out"), "image_size": SIDE,
                          "image_column": "pixels", "label_column": "y", "readers": 2, **overrides})
