"""What every engine shares, free of TensorFlow, torch and Horovod: the typed config, the dataset and its readers'
sharding rules, scaling rules, the progress document, checkpoint state and the resume decision, MLflow tracking,
the batch-size probe's rules, input-wait figures, and one attempt's frame (checks, finishing, failing).

An engine (engines/: keras_horovod, keras_mirrored, lightning_ddp) with its framework (frameworks/) supplies only what differs: its collectives, its model and
training loop, and the bytes of its checkpoints.
"""
