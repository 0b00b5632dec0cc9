"""A run's children never take a name mpi-operator gives the objects of another run's MPIJob (same kind, same
namespace): the second of the two would be stuck. mpi-operator (v0.3 and v0.8, /work/shared/mpi-operator) names,
for MPIJob M: ConfigMap M-config, Secret M-ssh, Job (launcher) M-launcher, pods M-worker-N, Service M or M-worker.
"""

from __future__ import annotations

import itertools

import pytest

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.common import config_map_name, mpijob_name, preprocess_job_name


def _run(name: str):
    return parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
                             "spec": {"dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/out"},
                                      "storage": {"credentialsSecret": "s"}}})


def ours(name: str) -> set[tuple[str, str]]:
    run = _run(name)
    return {("ConfigMap", config_map_name(run)), ("Job", preprocess_job_name(run)), ("MPIJob", mpijob_name(run))}


def mpi_operators(mpijob: str, workers: int = 3) -> set[tuple[str, str]]:
    return {("ConfigMap", f"{mpijob}-config"), ("Secret", f"{mpijob}-ssh"), ("Job", f"{mpijob}-launcher"),
            ("Service", mpijob), ("Service", f"{mpijob}-worker"),
            *{("Pod", f"{mpijob}-worker-{i}") for i in range(workers)}}


# Names built to collide: a run named after another's MPIJob, its launcher, its ConfigMap, its workers.
NAMES = ["x", "x-train", "x-train-train", "x-train-launcher", "x-config", "x-train-config", "x-preprocess",
         "x-train-worker", "x-train-worker-0", "x-runconfig", "x-train-ssh", "train", "config"]


@pytest.mark.parametrize("first,second", list(itertools.product(NAMES, NAMES)))
def test_no_child_of_one_run_has_a_name_mpi_operator_gives_another_runs_objects(first, second):
    theirs = mpi_operators(mpijob_name(_run(second)))
    assert not ours(first) & theirs
    if first != second:
        assert not ours(first) & ours(second)
