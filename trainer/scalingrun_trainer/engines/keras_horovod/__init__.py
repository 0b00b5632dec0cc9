"""Keras + Horovod (spec.training.strategy: horovod, the default for keras): one process per GPU, started by
horovodrun or mpirun; Horovod averages the gradients and the metrics and broadcasts rank 0's variables."""
