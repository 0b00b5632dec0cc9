"""What rank 0 trains on, in progress.json and status (GPUsUnused), and what a run cost in process-hours."""

from __future__ import annotations

from scalingrun_api.models import Devices
from scalingrun_api.progress import Progress
from scalingrun_operator.decide import progress as mirror
from scalingrun_operator.decide.snapshot import CLUSTER, LOCAL
from tests.support.decide_world import RUN


def test_the_document_carries_the_devices_and_readers_take_only_valid_ones():
    document = Progress(processes=2, devices=Devices(kind="gpu", count=1, name="NVIDIA H100")).document()
    assert document["devices"] == {"kind": "gpu", "count": 1, "name": "NVIDIA H100"}
    assert Progress.read(document).devices == Devices(kind="gpu", count=1, name="NVIDIA H100")
    assert "devices" not in Progress().document()  # as featureCache: only once known
    for junk in ({"kind": "tpu"}, {"count": 1}, "gpu"):
        assert Progress.read({"devices": junk, "epoch": 3}) == Progress(epoch=3), junk
    # A junk count is left out, the kind kept (Progress.read's rule).
    assert Progress.read({"devices": {"kind": "gpu", "count": -1}}).devices == Devices(kind="gpu")


def test_gpus_unused_only_when_gpus_were_asked_for_and_none_is_used():
    on_gpus = RUN.model_copy(deep=True)
    on_gpus.spec.workers.gpus_per_worker = 2
    status, reason, message = mirror.gpus_unused(on_gpus, CLUSTER.trainer_place("my/trainer:cpu"),
                                                 {"kind": "cpu", "count": 0})
    assert (status, reason) == ("True", "NoGPUVisible")
    for words in ("gpusPerWorker is 2", "in image my/trainer:cpu", "CUDA build", "NVIDIA device plugin", "nodeSelector"):
        assert words in message
    # A local run trains in this machine's Python (inside a GPU image, say): no image of the spec's is named.
    local = mirror.gpus_unused(on_gpus, LOCAL.trainer_place("my/trainer:cpu"), {"kind": "cpu", "count": 0})[2]
    assert "sees no GPU on this machine" in local and "my/trainer" not in local
    assert mirror.gpus_unused(on_gpus, "x", {"kind": "gpu", "count": 1})[:2] == ("False", "GPUsInUse")
    assert mirror.gpus_unused(on_gpus, "x", None) is None  # the trainer has not said (or a command of one's own)
    assert mirror.gpus_unused(RUN, "x", {"kind": "cpu", "count": 0}) is None  # gpusPerWorker 0: CPU on purpose


def test_process_hours_are_the_sweeps_worker_hours_and_gpu_hours_count_each_process_gpus():
    progress = {"processes": 4, "elapsedSeconds": 900.0, "devices": {"kind": "gpu", "count": 2}}
    assert Progress.read(progress).process_hours() == 1.0
    status = mirror.training_status(Progress.read(progress))
    assert (status["processHours"], status["gpuHours"]) == (1.0, 2.0)
    assert "processHours" not in mirror.training_status(Progress.read({"processes": 4}))  # no training time yet
