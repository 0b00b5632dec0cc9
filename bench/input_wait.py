"""The input-wait share (scalingrun_trainer.core.input_wait): does it read what it should, and what does it cost?

(1) Accuracy: a small Keras model trains on in-memory batches, each delayed by D seconds in the pipeline
    (the trainer's own diagnostic delay, before the prefetch). The time that waiting cost is the epoch's
    time with the delay, T_D, minus its time without, T_0: the share to expect is 1 - T_0 / T_D, read
    from epoch times alone, against the meter's share of the same epoch (the naive 1 - C / D, with C the
    step time without delay, assumes the compute per step stays the same, which a loaded CPU breaks).
(2) Overhead: epoch time of the same training with and without the stamp and the meter (which make Keras
    sync each step), rounds interleaved, medians.

Run: .venv/bin/python bench/input_wait.py [--steps 30] [--rounds 3] [--side 32] [--batch 32]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
print = functools.partial(print, flush=True)  # noqa: A001 - lines as they come, also when piped


def model_for(side: int):
    import tensorflow as tf

    model = tf.keras.Sequential([
        tf.keras.Input((side, side, 3), dtype="uint8"), tf.keras.layers.Rescaling(1 / 255),
        tf.keras.layers.Conv2D(32, 3, activation="relu"), tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def dataset(side: int, batch: int, delay: float):
    import numpy as np
    import tensorflow as tf

    from scalingrun_trainer.frameworks.keras.input_clock import delay_batches

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch * 8, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, (batch * 8,), dtype=np.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(batch, drop_remainder=True)
    if delay > 0:
        data = delay_batches(data, delay)
    return data.prefetch(tf.data.AUTOTUNE)


def train(side: int, batch: int, steps: int, delay: float, meter: bool) -> tuple[float, float | None]:
    """(seconds of the second epoch, its measured input-wait share or None)."""
    from scalingrun_trainer.frameworks.keras.callbacks import InputWaitMeter
    from scalingrun_trainer.frameworks.keras.input_clock import InputClock

    import tensorflow as tf

    clock = InputClock()
    data = dataset(side, batch, delay)
    callbacks, input_meter = [], None
    if meter:
        data = clock.attach(data)
        input_meter = InputWaitMeter(clock)
        callbacks.append(input_meter)
    times: list[float] = []

    class EpochTimer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.started)

    model = model_for(side)
    model.fit(data, steps_per_epoch=steps, epochs=2, callbacks=[*callbacks, EpochTimer()], verbose=0)
    share = input_meter.latest.input_wait_fraction if input_meter else None
    return times[-1], share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--side", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    plain, metered = [], []
    for _ in range(args.rounds):
        plain.append(train(args.side, args.batch, args.steps, 0.0, meter=False)[0])
        metered.append(train(args.side, args.batch, args.steps, 0.0, meter=True)[0])
    compute = statistics.median(metered) / args.steps
    print(f"{args.steps} steps of batch {args.batch} at {args.side}x{args.side}; medians of {args.rounds} rounds")
    print(f"(2) epoch without meter {statistics.median(plain):.2f} s, with {statistics.median(metered):.2f} s: "
          f"overhead {statistics.median(metered) / statistics.median(plain) - 1:+.1%} "
          f"(rounds {' '.join(f'{v:.2f}' for v in plain)} / {' '.join(f'{v:.2f}' for v in metered)})")
    print(f"(1) compute per step C = {1000 * compute:.1f} ms")
    print("    delay D per batch | 1 - C/D | expected 1 - T_0/T_D | measured share (each round: expected/measured)")
    for factor in (0.5, 2.0, 4.0, 10.0):
        delay = factor * compute
        runs = [train(args.side, args.batch, args.steps, delay, meter=True) for _ in range(args.rounds)]
        expected = [max(0.0, 1 - statistics.median(metered) / seconds) for seconds, _ in runs]
        print(f"    {1000 * delay:14.1f} ms | {max(0.0, 1 - compute / delay):7.2f} | "
              f"{statistics.median(expected):20.2f} | {statistics.median(share for _, share in runs):.2f} "
              f"({' '.join(f'{e:.2f}/{share:.2f}' for e, (_, share) in zip(expected, runs))})")


if __name__ == "__main__":
    main()
