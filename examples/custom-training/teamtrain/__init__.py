"""A team's own training scripts for spec.training.command (they report through scalingrun_trainer.sdk)."""
