"""scalingrun trainer: preprocessing and Horovod training (no kopf here)."""
