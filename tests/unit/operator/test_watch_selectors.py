"""The server-side label selector of the pod, Job and MPIJob watches matches what the operator puts on them."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource
from kubernetes import client

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.common import labels
from scalingrun_operator.cluster.k8s import MANAGED_SELECTOR
from scalingrun_operator.cluster.k8s import Kube
from scalingrun_operator.cluster.runtime import Runtime
from scalingrun_operator.config import Config
from scalingrun_operator.handlers.lifecycle import configure
from scalingrun_operator.handlers.runs import MANAGED
from tests.support.specs import run_document


def test_the_selector_is_the_handlers_label_filter_and_every_child_carries_it():
    assert dict(pair.split("=") for pair in MANAGED_SELECTOR.split(",")) == MANAGED
    run = parse_scalingrun(run_document())
    for component in ("preprocess", "training", "config"):
        assert MANAGED.items() <= labels(run, component).items()


def test_only_pods_jobs_and_mpijobs_are_watched_with_it():
    """The start-up handler's settings, as kopf gets them (a Runtime of its own, stopped again)."""
    settings = kopf.OperatorSettings()
    runtime = Runtime(Config(metrics_port_number=0), Kube(client.ApiClient()))
    try:
        configure(settings=settings, memo=kopf.Memo(runtime=runtime))
    finally:
        runtime.stop()
    selective = [Resource("", "v1", "pods"), Resource("batch", "v1", "jobs"),
                 Resource("kubeflow.org", "v2beta1", "mpijobs")]
    for resource in selective:
        assert settings.watching.label_selectors.collect(resource) == [MANAGED_SELECTOR], resource
    # The runs themselves are the users': every one is watched.
    for resource in (Resource("scalingrun.dev", "v1alpha1", "scalingruns"), Resource("", "v1", "configmaps"),
                     Resource("metrics.k8s.io", "v1beta1", "pods")):
        assert settings.watching.label_selectors.collect(resource) == [], resource
