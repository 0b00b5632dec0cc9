"""The frameworks the engines train with (TensorFlow/Keras, PyTorch Lightning): each builds, restores, fits and
saves a network, over core/; none knows how its processes talk to each other."""
