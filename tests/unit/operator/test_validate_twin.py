"""`scalingrun validate` refuses at least what the API server refuses (issue 41, item 5), each with its fix: a key
twice (kubectl refuses it; YAML keeps the last), an unknown field in any spelling (gpus_per_worker is pydantic's
name for a field, not the API's: the CRD prunes it and the run gets the default), a quantity written as a number,
a near-miss name. Every spec in examples/ and a table of bad specs go through the command as a user types it, and
the messages are asserted whole. The API server on the same kinds of specs: tests/integration/
test_validation_admission.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scalingrun_operator.cli import main
from scalingrun_operator.schema import strict_yaml
from scalingrun_operator.schema.field_errors import unknown_field_message
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from tests.support.specs import MINIMAL

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("**/*.yaml"))

RUN = """\
apiVersion: scalingrun.dev/v1alpha1
kind: ScalingRun
metadata:
  name: demo
spec:
  storage:
    credentialsSecret: s3-creds
  dataset:
    source: s3://bucket/raw
    output: s3://bucket/parquet
"""
SWEEP = """\
apiVersion: scalingrun.dev/v1alpha1
kind: ScalingSweep
metadata:
  name: sweep
spec:
  workers: [1, 2]
  template:
    storage:
      credentialsSecret: s3-creds
    dataset:
      source: s3://bucket/raw
      output: s3://bucket/parquet
"""
INVALID = "{file}: ScalingRun demo is invalid:\n"
CAMEL = "unknown field: write {camel} (fields are camelCase; the API server refuses or drops {snake})"

# (id, the file, what validate says on stderr: {file} is its path)
BAD_SPECS = [
    ("snake-case-field", RUN + "  workers:\n    gpus_per_worker: 0\n",
     INVALID + "  spec.workers.gpus_per_worker: " + CAMEL.format(camel="gpusPerWorker", snake="gpus_per_worker")),
    ("snake-case-section", RUN + "  run_policy:\n    suspend: true\n",
     INVALID + "  spec.run_policy: " + CAMEL.format(camel="runPolicy", snake="run_policy")),
    ("snake-case-top-level", RUN.replace("apiVersion:", "api_version:"),
     INVALID + "  api_version: " + CAMEL.format(camel="apiVersion", snake="api_version")),
    ("kebab-case", RUN + "  workers:\n    gpus-per-worker: 0\n",
     INVALID + "  spec.workers.gpus-per-worker: " + CAMEL.format(camel="gpusPerWorker", snake="gpus-per-worker")),
    ("other-case", RUN + "  workers:\n    GpusPerWorker: 0\n",
     INVALID + "  spec.workers.GpusPerWorker: unknown field: write gpusPerWorker (field names are case-sensitive)"),
    ("near-miss", RUN + "  workers:\n    replica: 2\n",
     INVALID + "  spec.workers.replica: unknown field; did you mean replicas?"),
    ("near-miss-section", RUN + "  trainng:\n    maxEpochs: 3\n",
     INVALID + "  spec.trainng: unknown field; did you mean training?"),
    ("near-miss-in-a-list", RUN + "  workers:\n    tolerations:\n    - keyy: gpu\n",
     INVALID + "  spec.workers.tolerations[0].keyy: unknown field; did you mean key?"),
    ("nothing-near", RUN + "  workers:\n    colour: blue\n", INVALID + "  spec.workers.colour: unknown field"),
    ("cpu-as-a-number", RUN + "  workers:\n    cpu: 0.5\n",
     INVALID + '  spec.workers.cpu: write "500m" (a quantity string), not the number 0.5'),
    ("cpu-limit-as-a-number", RUN + "  launcher:\n    resources:\n      cpuLimit: 1.25\n",
     INVALID + '  spec.launcher.resources.cpuLimit: write "1250m" (a quantity string), not the number 1.25'),
    ("duplicate-section", RUN + "  dataset:\n    preprocessing:\n      resources:\n        memory: 1.5\n",
     "{file}: not valid YAML (line 11, column 3): key 'dataset' appears twice in one mapping (first on line 8): "
     "kubectl and the API server refuse a duplicate key; keep one"),
    ("memory-as-a-number", RUN.replace("    output: s3://bucket/parquet\n", "    output: s3://bucket/parquet\n"
                                            "    preprocessing:\n      resources:\n        memory: 1.5\n"),
     INVALID + '  spec.dataset.preprocessing.resources.memory: write a quantity string such as "1.5Gi" (if you meant '
     "gibibytes), not the number 1.5"),
    ("duplicate-key", RUN + "  workers:\n    cpu: 1\n    cpu: 2\n",
     "{file}: not valid YAML (line 13, column 5): key 'cpu' appears twice in one mapping (first on line 12): "
     "kubectl and the API server refuse a duplicate key; keep one"),
    ("duplicate-key-in-flow-style", RUN + "  workers: {replicas: 2, replicas: 4}\n",
     "{file}: not valid YAML (line 11, column 26): key 'replicas' appears twice in one mapping (first on line 11): "
     "kubectl and the API server refuse a duplicate key; keep one"),
    ("sweep-template", SWEEP.replace("  workers: [1, 2]\n", "  workers: [1, 2]\n  max_parallel: 2\n")
     + "    workers:\n      gpus_per_worker: 0\n",
     "{file}: ScalingSweep sweep is invalid:\n"
     "  spec.max_parallel: " + CAMEL.format(camel="maxParallel", snake="max_parallel") + "\n"
     "  spec.template.workers.gpus_per_worker: " + CAMEL.format(camel="gpusPerWorker", snake="gpus_per_worker")),
    ("every-error-at-once", RUN + "  workers:\n    replica: 2\n    cpu: 0.5\n    gpus_per_worker: 0\n",
     INVALID + "  spec.workers.replica: unknown field; did you mean replicas?\n"
     '  spec.workers.cpu: write "500m" (a quantity string), not the number 0.5\n'
     "  spec.workers.gpus_per_worker: " + CAMEL.format(camel="gpusPerWorker", snake="gpus_per_worker")),
]


def test_every_example_is_valid(capsys):
    assert main(["validate", *[arg for example in EXAMPLES for arg in ("-f", str(example))]]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    said = out.splitlines()
    documents = [(example, doc) for example in EXAMPLES for doc in yaml.safe_load_all(example.read_text()) if doc]
    assert said == [f"{example}: {doc['kind']} {doc['metadata']['name']} is valid" for example, doc in documents]


@pytest.mark.parametrize("text, says", [row[1:] for row in BAD_SPECS], ids=[row[0] for row in BAD_SPECS])
def test_a_bad_spec_gets_the_exact_message_and_exit_1(tmp_path, capsys, text, says):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main(["validate", "-f", str(spec)]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", says.format(file=spec) + "\n")


def test_a_duplicate_key_in_json_is_refused_too(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text('{"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "kind": "ScalingSweep"}')
    assert main(["validate", "-f", str(spec)]) == 1
    assert "key 'kind' appears twice in one mapping (first on line 1)" in capsys.readouterr().err


def test_keys_merged_in_may_be_overridden_as_yaml_allows():
    text = "defaults: &defaults {cpu: 1, memory: 2Gi}\nworkers:\n  <<: *defaults\n  cpu: 2\n"
    assert strict_yaml.load(text)["workers"] == {"cpu": 2, "memory": "2Gi"}


def test_the_operator_and_sweeps_share_the_rules():
    """The operator parses a run's spec with parse_scalingrun (decide/run.py) and a sweep's with parse_scalingsweep:
    a spelling the API server would drop is refused there too, not validated as a default."""
    run = {**MINIMAL, "spec": {**MINIMAL["spec"], "workers": {"gpus_per_worker": 0}}}
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(run)
    assert [str(e) for e in caught.value.errors] == [
        "spec.workers.gpus_per_worker: " + CAMEL.format(camel="gpusPerWorker", snake="gpus_per_worker")]
    sweep = yaml.safe_load(SWEEP)
    sweep["spec"]["template"]["dataset"]["validation_fraction"] = 0.2
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep(sweep)
    assert [e.path for e in caught.value.errors] == ["spec.template.dataset.validation_fraction"]


@pytest.mark.parametrize("key, says", [
    ("learning_rate_scaling", "unknown field: write learningRateScaling (fields are camelCase; the API server refuses "
                              "or drops learning_rate_scaling)"),
    ("LearningRateScaling", "unknown field: write learningRateScaling (field names are case-sensitive)"),
    ("learningRateScale", "unknown field; did you mean learningRateScaling?"),
    ("lr", "unknown field"),
])
def test_the_name_meant(key, says):
    assert unknown_field_message(key, ["baseLearningRate", "learningRateScaling", "maxEpochs"]) == says
