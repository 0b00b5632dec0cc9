"""Open MPI's mpirun for the Keras + MultiWorkerMirroredStrategy trainer (the Keras venv: no second one)."""

from tests.support.mpirun import mpirun  # noqa: F401 - the same launcher as the Lightning tests
