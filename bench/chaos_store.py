"""bench/chaos.py's reads after a run ends: its progress.json history, checkpoints and model from the store (the model
loaded and asked to predict: Keras with tf.keras, a Lightning run's TorchScript with torch where this Python has it),
then the run deleted and anything left of it looked for. And the bodies of the soak's runs and sweeps.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from bench.chaos_invariants import NO_TORCH, RunRecord
from bench.chaos_pace import SWEEP_POINTS
from tests.support.e2e_runs import child_objects, run_body
from tests.support.node_faults import CAPACITY

OUTPUT = "s3://scalingrun-e2e/chaos/parquet"  # one dataset: the first run preprocesses it, the others reuse it
GROUP, VERSION, SWEEPS = "scalingrun.dev", "v1alpha1", "scalingsweeps"


def body_for(cluster: Any, kind: str, name: str, args: Any) -> dict[str, Any]:
    body = run_body(cluster, name, output=OUTPUT, epochs=args.epochs, worker_cpu=args.worker_cpu, patience=args.epochs,
                    image=cluster.lightning_image if kind == "lightning" else None)
    spec = body["spec"]
    spec["dataset"]["imageSize"] = 32
    spec["dataset"]["preprocessing"].update(readers=4, resources={"cpu": "250m", "memory": "1Gi"})
    spec["training"].update(stallTimeout=args.stall_timeout, nodeLossGracePeriod=20,
                            maxInterruptions=args.max_interruptions)
    spec["workers"].update(replicas=args.workers, memory=args.worker_memory, terminationGracePeriod=10)
    if kind == "lightning":
        spec["training"]["framework"] = "pytorch-lightning"
    if kind == "elastic":  # as tests/e2e/test_elastic.py's: a unit of CAPACITY per worker
        spec["workers"].update(replicas=2, minReplicas=1, resizeAfter=15, gpuResource=CAPACITY, gpusPerWorker=1,
                               cpuLimit="1")
    return body


def sweep_body(cluster: Any, name: str, args: Any) -> dict[str, Any]:
    """A ScalingSweep over SWEEP_POINTS workers of a keras run's template (the soak's dataset, so its first point
    reuses it); as tests/e2e/test_in_cluster.py's sweep, a wide accuracy tolerance lets efficiency decide."""
    template = body_for(cluster, "keras", "template", args)["spec"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ScalingSweep", "metadata": {"name": name},
            "spec": {"workers": list(SWEEP_POINTS), "template": template, "accuracyTolerance": 1.0,
                     "efficiencyThreshold": 0.7}}


def sweep_point(sweep: str, workers: int) -> str:
    return f"{sweep}-w{workers}"  # scalingrun_operator.schema.sweep.point_name


def load_model(path: str, framework: str) -> str:
    """Loads a downloaded model and predicts on a batch of 2 zero images of its input's shape; returns what it showed.
    Raises when it does not load or predicts the wrong shape. TensorFlow and torch are imported here only."""
    if framework == "pytorch-lightning":
        if importlib.util.find_spec("torch") is None:
            return NO_TORCH
        import torch

        net = torch.jit.load(path).eval()
        size = 32  # the soak's imageSize
        with torch.no_grad():
            out = net(torch.zeros((2, size, size, 3), dtype=torch.uint8))
        shape = tuple(out.shape)
    else:
        import numpy as np
        import tensorflow as tf

        model = tf.keras.models.load_model(path, compile=False)
        batch = np.zeros((2, *model.input_shape[1:]), dtype=model.inputs[0].dtype.name)
        out = model.predict(batch, verbose=0)
        shape = tuple(out.shape)
        if not np.all(np.isfinite(out)):
            raise ValueError(f"predicted non-finite values {out.tolist()}")
    if len(shape) != 2 or shape[0] != 2 or shape[1] < 2:
        raise ValueError(f"predicted shape {shape} for a batch of 2: not (2, classes)")
    return f"loaded, predicted {shape}"


def read_store(cluster: Any, record: RunRecord, run: dict, log: Callable[[str], None]) -> None:
    from pyarrow import fs as pafs

    location = f"{OUTPUT}/runs/{record.name}"[len("s3://"):]
    for attempt in range(3):
        try:
            with cluster.s3() as s3:
                document: dict = {}
                with contextlib.suppress(FileNotFoundError, OSError):
                    document = json.loads(s3.open_input_stream(f"{location}/progress.json").read())
                    record.history = [entry["epoch"] for entry in document.get("history") or []]
                model = (run.get("status") or {}).get("modelUri")
                if model:
                    info = s3.get_file_info(model[len("s3://"):])
                    record.model_size = info.size if info.type == pafs.FileType.File else None
                    if record.model_size and record.phase == "Succeeded":
                        fetch_and_load(s3, model, run, record)
                if not record.model_size:
                    record.model_note = model_note(s3, location, model, run, document, cluster)
                files = s3.get_file_info(pafs.FileSelector(f"{location}/checkpoints", recursive=True,
                                                           allow_not_found=True))
                record.checkpoints = sum(f.type == pafs.FileType.File for f in files)
                return
        except Exception as exc:  # the store's pod killed meanwhile: again
            log(f"store read for {record.name}: {type(exc).__name__}: {exc}")
            time.sleep(10)


def model_note(s3: Any, location: str, model: Optional[str], run: dict, document: dict, cluster: Any) -> str:
    """Why a Succeeded run shows no model: whether status named one (when it turned Succeeded, and read again now),
    the store's progress.json (its state and modelUri), what is under <run>/model, and the Trained condition."""
    from pyarrow import fs as pafs

    later = "unread"
    with contextlib.suppress(Exception):  # the API server through a fault: said so
        later = (cluster.get_run(run["metadata"]["name"]).get("status") or {}).get("modelUri") or "absent"

    stored = s3.get_file_info(pafs.FileSelector(f"{location}/model", recursive=True, allow_not_found=True))
    files = [f"{f.path.rsplit('/', 1)[-1]} {f.size} bytes" for f in stored if f.type == pafs.FileType.File]
    trained = next((c for c in (run.get("status") or {}).get("conditions") or [] if c.get("type") == "Trained"), {})
    return (f"status.modelUri {model or 'absent'}; the store's progress.json {document.get('state')} with modelUri "
            f"{document.get('modelUri')}; under model/: {', '.join(files) or 'nothing'}; Trained "
            f"{trained.get('reason')}: {(trained.get('message') or '')[:300]}; status.modelUri read again: {later}")


def fetch_and_load(s3: Any, model: str, run: dict, record: RunRecord) -> None:
    framework = ((run.get("spec") or {}).get("training") or {}).get("framework") or "keras"
    with tempfile.TemporaryDirectory(prefix="chaos-model-") as folder:
        path = str(Path(folder) / model.rsplit("/", 1)[-1])
        with s3.open_input_stream(model[len("s3://"):]) as source, open(path, "wb") as target:
            target.write(source.read())
        try:
            record.model_loaded, record.model_error = load_model(path, framework), ""
        except Exception as exc:  # the invariant's line says why
            record.model_loaded, record.model_error = None, f"{type(exc).__name__}: {str(exc)[:200]}"


def delete_and_look(cluster: Any, name: str, timeout: float = 120) -> list[str]:
    """Deletes the run, then what is still there of it after `timeout` s: pods (capacity probes too), MPIJob, Jobs,
    ConfigMaps."""
    with contextlib.suppress(BaseException):  # its pods not gone in time: listed below
        cluster.delete_run(name, timeout=timeout)
    return look_for_leftovers(cluster, name)


def look_for_leftovers(cluster: Any, name: str) -> list[str]:
    deadline = time.monotonic() + 60
    while True:
        left = [f"pod {p.metadata.name}" for p in cluster.run_pods(name)] + \
            [f"{kind} {n}" for kind, objects in child_objects(cluster, name).items() for n, _ in objects]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(2)


def delete_sweep_and_look(cluster: Any, name: str) -> list[str]:
    """Deletes the sweep (its point runs are owned by it: the garbage collector deletes them), then what is left of
    the sweep and of each point."""
    custom = cluster.custom()
    with contextlib.suppress(Exception):
        custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, SWEEPS, name)
    left: list[str] = []
    deadline = time.monotonic() + 180
    for workers in SWEEP_POINTS:
        point = sweep_point(name, workers)
        while time.monotonic() < deadline:
            try:
                cluster.get_run(point)
            except Exception as exc:
                if getattr(exc, "status", None) == 404:  # gone; else the API server through a fault: again
                    break
            time.sleep(3)
        else:
            left.append(f"ScalingRun {point}")
        left += look_for_leftovers(cluster, point)
    with contextlib.suppress(Exception):
        custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, SWEEPS, name)
        left.append(f"ScalingSweep {name}")
    return left


def parse_time(text: Optional[str]) -> Optional[float]:
    import datetime as dt

    if not text:
        return None
    with contextlib.suppress(ValueError):
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return None


def nonzero(counts: Optional[dict]) -> dict[str, int]:
    return {k: v for k, v in (counts or {}).items() if v}
