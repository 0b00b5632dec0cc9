"""The test-only MPIJob controller (stand-in for mpi-operator v0.8) and its deployment; never shipped."""
