"""PyTorch Lightning + DDP (spec.training.framework: pytorch-lightning, strategy: ddp): one process per GPU under
mpirun, DDP over Lightning's MPI cluster environment."""
