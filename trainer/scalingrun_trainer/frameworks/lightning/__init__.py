"""The PyTorch Lightning trainer (spec.training.framework: pytorch-lightning): DDP over the same MPIJob.

A sibling of the Keras + Horovod trainer: it reuses the pure shared parts (dataset manifest, scaling rules,
progress document, storage, MLflow client) and imports torch, never TensorFlow or Horovod.
"""
