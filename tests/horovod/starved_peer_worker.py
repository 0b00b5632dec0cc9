"""Run under horovodrun --gloo: the trainer's Horovod settings (setdefault, as keras_horovod.train does), then
allreduces until told to stop; rank 1 prints its pid so that the test can stop it, as a starved CPU would."""

import os
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from scalingrun_trainer.core.stall import engine_timeout
from scalingrun_trainer.engines.keras_horovod.train import stall_settings

for name, value in stall_settings(engine_timeout()).items():
    os.environ.setdefault(name, value)
hvd.init()
done = Path(sys.argv[1])
print(f"rank={hvd.rank()} pid={os.getpid()} gloo_timeout={os.environ['HOROVOD_GLOO_TIMEOUT_SECONDS']}", flush=True)
rounds = 0
while not done.exists():
    hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
    rounds += 1
    time.sleep(0.2)
hvd.allreduce(tf.constant(1.0), op=hvd.Sum)  # the last one together: both saw `done`
print(f"rank={hvd.rank()} finished after {rounds} rounds", flush=True)
