"""The Python client: a ScalingRun from a notebook or a script, on the same pydantic models as the CRD.

    import scalingrun
    run = scalingrun.Run.from_yaml("examples/quickstart.yaml").submit()     # the kubeconfig's cluster
    run.wait()                                                              # epochs, ETA, images/s
    run.metrics()                                                           # a pandas DataFrame, one row an epoch

`submit(local=True)` runs it on this machine (the local runner, `scalingrun run --local`) with the same calls;
`HorovodRunner(np=-2).run(fn)` runs a function under Horovod here, `np=2, run=...` in a ScalingRun of 2 workers, and
returns rank 0's value; `LightningRunner(np=-2).run(fn)` the same with torch.distributed's DDP world set up for a
PyTorch function (docs/python-client.md).
"""

from .backends import ClusterError, RunDeleted
from .horovod_runner import HorovodRunner, HorovodRunnerError
from .lightning_runner import LightningRunner, LightningRunnerError
from .run import InvalidRun, Run, RunFailed, RunNotSubmitted

__all__ = ["ClusterError", "HorovodRunner", "HorovodRunnerError", "InvalidRun", "LightningRunner",
           "LightningRunnerError", "Run", "RunDeleted", "RunFailed", "RunNotSubmitted"]
