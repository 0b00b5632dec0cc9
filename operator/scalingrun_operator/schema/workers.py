"""The rules of spec.workers that the CRD schema cannot say: a GPU resource in Kubernetes' own domain, several GPUs
a worker of a MIG slice and a /dev/shm as large as the memory limit are errors; an image our naming scheme marks as a CPU build beside a GPU request is a
warning (valid, but the run would hold GPUs and train on the CPU). An elastic run's range (minReplicas <= replicas;
resizeAfter only beside minReplicas)."""

from __future__ import annotations

from scalingrun_api.engines import cpu_flavour_of, engine
from scalingrun_api.models import ScalingRun, quantity_value
from .findings import FieldError, SpecWarning

CPU_IMAGE_WITH_GPUS = "CPUImageWithGPUs"  # the Warning Event's reason
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # NVIDIA's device plugin's MIG resources (mixed strategy)


def workers_errors(run: ScalingRun) -> list[FieldError]:
    workers = run.spec.workers
    errors = []
    resource = workers.gpu_resource or ""
    # The API server's rule for extended resources (IsExtendedResourceName): outside kubernetes.io, no requests.
    if "kubernetes.io/" in resource or resource.startswith("requests."):
        errors.append(FieldError("spec.workers.gpuResource", f"{resource} is not an extended resource "
                                 "(Kubernetes' own domain): name the device plugin's, e.g. nvidia.com/gpu, "
                                 "nvidia.com/mig-3g.40gb or amd.com/gpu"))
    # CUDA shows a process one MIG slice, whatever the pod holds: the engines' one process per GPU (Horovod, DDP) or
    # one process over all of them (multi-worker-mirrored) would find one device where they expect several.
    if resource.startswith(MIG_RESOURCE_PREFIX) and workers.gpus_per_worker > 1:
        errors.append(FieldError("spec.workers.gpusPerWorker", f"must be 1 with a MIG slice ({resource}), got "
                                 f"{workers.gpus_per_worker}: CUDA shows a process one MIG slice, so a worker cannot "
                                 "train on several; ask for more workers (spec.workers.replicas) of one slice each"))
    shm, memory = workers.shared_memory, workers.memory
    if shm and memory and quantity_value(shm) >= quantity_value(memory):
        errors.append(FieldError("spec.workers.sharedMemory", f"must be below spec.workers.memory ({memory}), got "
                                 f"{shm}: what /dev/shm holds counts against the worker's memory limit"))
    errors += _elastic_errors(run)
    return errors


def _elastic_errors(run: ScalingRun) -> list[FieldError]:
    workers = run.spec.workers
    if workers.min_replicas is None:
        if workers.resize_after is not None:
            return [FieldError("spec.workers.resizeAfter", "means something only for an elastic run: set "
                               "spec.workers.minReplicas (the fewest workers it may train with), or remove it")]
        return []
    if workers.min_replicas > workers.replicas:
        return [FieldError("spec.workers.minReplicas", f"must be at most spec.workers.replicas ({workers.replicas}, "
                           f"the most workers), got {workers.min_replicas}")]
    return []


def workers_warnings(run: ScalingRun) -> list[SpecWarning]:
    workers, training = run.spec.workers, run.spec.training
    flavour = cpu_flavour_of(workers.image or "")
    if not workers.gpus_per_worker or flavour is None:
        return []
    gpu_flavour = engine(training.framework, training.strategy).gpu_flavour
    instead = (f"{workers.image[:-len(flavour)]}{gpu_flavour}" if workers.image.endswith(flavour)
               else f"the -{gpu_flavour} flavour")
    return [SpecWarning(
        CPU_IMAGE_WITH_GPUS, "spec.workers.image",
        f"{workers.image} is a CPU build (its tag names the {flavour} flavour) but spec.workers.gpusPerWorker is "
        f"{workers.gpus_per_worker}: the workers would hold their GPUs and train on the CPU. Use {instead}, leave "
        "spec.workers.image out for the GPU image of the engine, or set gpusPerWorker: 0 to train on CPU on purpose")]
