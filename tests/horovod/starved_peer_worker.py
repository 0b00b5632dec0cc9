"""Run under horovodrun --gloo: the trainer's Horovod settings (setdefault, as keras_horovod.train does), then
allreduces until told to stop; rank 1 prints its pid so that the test can stop it, as a starved CPU would."""

import os
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from scalingrun_api.engines import horovod_stall_env
from scalingrun_trainer.core.stall import engine_timeout

for name, value in horovod_stall_env(engine_timeout()).items():
    os.environ.setdefault(name, value)
hvd.init()
done = Path(sys.argv[1])
print(f"rank={hvd.rank()} pid={os.getpid()} gloo_timeout={os.environ['HOROVOD_GLOO_TIMEOUT_SECONDS']}", flush=True)
rounds = 0
# Each round's sum says whether any rank saw `done`, so that both leave after the same round (a rank leaving one
# round earlier would leave its peer alone in a collective).
while float(hvd.allreduce(tf.constant(1.0 if done.exists() else 0.0), op=hvd.Sum)) == 0:
    rounds += 1
    time.sleep(0.2)
print(f"rank={hvd.rank()} finished after {rounds} rounds", flush=True)
