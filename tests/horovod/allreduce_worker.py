"""Run under horovodrun: every rank averages its rank number and reports what it saw."""

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
average = hvd.allreduce(tf.constant(float(hvd.rank())), op=hvd.Average)
root_value = hvd.broadcast(tf.constant(100 + hvd.rank()), root_rank=0)
print(f"rank={hvd.rank()} size={hvd.size()} average={float(average):.2f} broadcast={int(root_value)}", flush=True)
