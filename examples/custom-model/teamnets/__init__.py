"""A team's own image classifiers, for spec.model.builder: keras_cnn (TensorFlow) and torch_cnn (PyTorch)."""
