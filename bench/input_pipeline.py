"""Input pipeline speed: images/s delivered to Keras from Parquet of 299x299x3 rows.

(a) ours: scalingrun_trainer.frameworks.keras.data.make_dataset (Petastorm's reader, pixels as zero-copy uint8 views of
    the row groups it read, batches drawn from a 256-row buffer across row groups; the model's first layer
    normalises, on the accelerator in a cluster)
(b) the seeds' configuration: make_batch_reader defaults, unbatch, then a per-row decode + float map, batch
(c) the decode-free bound: a bare pyarrow read of the same files

Ratios are of medians against (c) and (b), measured in the same run, rounds interleaved so that load
from other work spreads over all three. 256 batches a round by default: the reader reads rowGroupCache row
groups ahead, work that shorter rounds count without taking its batches. With --step-split it also runs under horovodrun (-np 1 and
-np 2) a small training loop of the trainer's own model and splits step time into input wait and compute.

Run: .venv/bin/python bench/input_pipeline.py [--rows 1024] [--batches 256] [--rounds 3] [--step-split]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDE = 299
BATCH = 32


def make_parquet(folder: Path, rows: int) -> str:
    """Real images (Fashion-MNIST JPEGs) preprocessed to 299x299 Parquet by our own preprocessing."""
    from scalingrun_trainer.preprocess.shards import Params, process_shard
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    source = folder / "jpeg"
    for relative, data in fashion_mnist_jpegs(rows // 10 + 1):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)
    output = folder / "parquet"
    process_shard(Params(str(source), str(output), image_size=SIDE, validation_fraction=0.01, max_readers=4), 0, 1)
    return str(output)


def rate_of(dataset, batches: int) -> float:
    iterator = iter(dataset)
    next(iterator)  # warm-up: reader threads, tracing
    start = time.perf_counter()
    images = 0
    for _ in range(batches):
        images += int(next(iterator)[0].shape[0])
    return images / (time.perf_counter() - start)


def ours(output: str, batches: int) -> float:
    from scalingrun_trainer.core.dataset import open_dataset
    from scalingrun_trainer.frameworks.keras.data import make_dataset

    dataset = open_dataset(output)
    data, reader = make_dataset(dataset, "train", rank=0, size=1, batch_size=BATCH, seed=0)
    try:
        return rate_of(data, batches)
    finally:
        reader.stop()
        reader.join()


def seed_config(output: str, batches: int) -> float:
    import tensorflow as tf
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    from scalingrun_trainer.core.dataset import open_dataset

    urls = open_dataset(output).urls("train")
    reader = make_batch_reader(urls, num_epochs=None)  # the seeds' reader: library defaults

    def per_row(row):
        image = tf.reshape(tf.io.decode_raw(row.image, tf.uint8), (SIDE, SIDE, 3))
        return tf.cast(image, tf.float32) / 127.5 - 1.0, row.label

    data = make_petastorm_dataset(reader).unbatch().map(per_row).batch(BATCH)
    try:
        return rate_of(data, batches)
    finally:
        reader.stop()
        reader.join()


def bare_pyarrow(output: str, rounds: int = 1) -> float:
    import pyarrow.parquet as pq

    from scalingrun_trainer.core.dataset import open_dataset

    dataset = open_dataset(output)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        rows = 0
        for name in dataset.files["train"]:
            for batch in pq.ParquetFile(os.path.join(output, name)).iter_batches(batch_size=BATCH, columns=["image", "label"]):
                rows += batch.num_rows
        best = max(best, rows / (time.perf_counter() - start))
    return best


def step_split_worker(output: str, steps: int) -> None:
    """Under horovodrun: time waiting for the next batch vs the training step, on rank 0."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from scalingrun_trainer.core.dataset import open_dataset
    from scalingrun_trainer.frameworks.keras.data import make_dataset
    from scalingrun_trainer.frameworks.keras.models import build_model

    hvd.init()
    data, reader = make_dataset(open_dataset(output), "train", rank=hvd.rank(), size=hvd.size(), batch_size=BATCH,
                                seed=0)
    # The trainer's model: uint8 in, MobileNetV2's normalisation as its first layer (counted as compute).
    model = build_model("mobilenet_v2", SIDE, 10, weights=None, dropout=0.0, trainable_base=False)
    optimizer = tf.keras.optimizers.legacy.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    iterator = iter(data)
    step(*next(iterator))
    hvd.broadcast_variables(model.variables, root_rank=0)
    wait = compute = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        images, labels = next(iterator)
        t1 = time.perf_counter()
        step(images, labels).numpy()
        t2 = time.perf_counter()
        wait, compute = wait + t1 - t0, compute + t2 - t1
    reader.stop()
    reader.join()
    if hvd.rank() == 0:
        print(json.dumps({"np": hvd.size(), "wait_ms": 1000 * wait / steps, "compute_ms": 1000 * compute / steps,
                          "images_per_s": steps * BATCH * hvd.size() / (wait + compute)}), flush=True)


def step_split(output: str, steps: int) -> None:
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    for np_ in (1, 2):
        result = subprocess.run(
            [horovodrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, __file__,
             "--worker", output, "--steps", str(steps)],
            capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        lines = [line.split(">:", 1)[-1] for line in result.stdout.splitlines() if '"np"' in line]
        if result.returncode or not lines:
            print(f"-np {np_}: failed\n{result.stderr[-2000:]}")
            continue
        r = json.loads(lines[-1])
        print(f"-np {r['np']}: step {r['wait_ms'] + r['compute_ms']:.0f} ms = input wait {r['wait_ms']:.1f} ms "
              f"+ compute {r['compute_ms']:.0f} ms; {r['images_per_s']:.0f} img/s (MobileNetV2 frozen, batch {BATCH}/rank)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-split", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        step_split_worker(args.worker, args.steps)
        return
    with tempfile.TemporaryDirectory(prefix="bench-input-") as folder:
        output = make_parquet(Path(folder), args.rows)
        rates: dict[str, list[float]] = {"a": [], "b": [], "c": []}
        for _ in range(args.rounds):
            rates["c"].append(bare_pyarrow(output))
            rates["a"].append(ours(output, args.batches))
            rates["b"].append(seed_config(output, args.batches))
        a, b, c = (statistics.median(rates[k]) for k in "abc")
        shown = {k: " ".join(f"{v:.0f}" for v in values) for k, values in rates.items()}
        print(f"{args.rows} rows of {SIDE}x{SIDE}x3, batch {BATCH}; medians of {args.rounds} rounds (each round)")
        print(f"(c) bare pyarrow read      : {c:8.0f} img/s   ({shown['c']})")
        print(f"(a) ours                   : {a:8.0f} img/s   {a / c:.2f} x (c)   {a / b:.2f} x (b)   ({shown['a']})")
        print(f"(b) seeds' configuration   : {b:8.0f} img/s   {b / c:.2f} x (c)   ({shown['b']})")
        if args.step_split:
            step_split(output, args.steps)


if __name__ == "__main__":
    main()
