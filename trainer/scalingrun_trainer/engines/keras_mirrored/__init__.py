"""Keras + tf.distribute.MultiWorkerMirroredStrategy (spec.training.strategy: multi-worker-mirrored): one process
per worker pod, using every GPU of its pod, started by mpirun; TF_CONFIG comes from the MPI world. No Horovod."""
