"""The articles' `train_hvd`, as a team writes it for `HorovodRunner(np=2, code_dir=TEAM_CODE).run(train_hvd, ...)`:
Horovod set up by the function, its network from the team's own module (examples/custom-training's teamtrain, in
no image of ours: shipped as code_dir), the run's prepared data read and its epochs reported through the SDK.
Shipped by value (its module is not installed in the trainer image), so it imports what it uses inside."""

from __future__ import annotations

from pathlib import Path

TEAM_CODE = Path(__file__).resolve().parents[2] / "examples" / "custom-training"


def train_hvd(learning_rate: float) -> dict:
    """The team's CNN fitted for the run's maxEpochs on this rank's shard; rank 0 returns what it saw of the world,
    the ranks' sum (1 + 2 over 2 ranks) and its last epoch's metrics (averaged over the ranks)."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from scalingrun_trainer import sdk
    from teamtrain.keras_horovod import network  # from the shipped code_dir

    hvd.init()
    ctx = sdk.context()
    tf.keras.utils.set_random_seed(ctx.seed)
    model = network(ctx)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(learning_rate * hvd.size()))
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(sdk.tf_dataset("train"), steps_per_epoch=ctx.steps_per_epoch, epochs=ctx.max_epochs,
                        validation_data=sdk.tf_dataset("validation"), verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback(), sdk.KerasCallback()])
    total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
    last = {key: float(values[-1]) for key, values in history.history.items()}
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total), "epochs": len(history.history["loss"]),
            "metrics": last}
