"""The checked-in CRD is generated from the models, and is a structural schema."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from scalingrun_operator.schema.crd import build_crd, render_chart_crd_template, render_crd_yaml

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "manifests/crd/scalingrun.dev_scalingruns.yaml"
CHART_TEMPLATE = ROOT / "charts/scalingrun/templates/crd.yaml"
REGENERATE = "out of date: run scripts/generate.sh"


def test_checked_in_crd_matches_the_models():
    assert MANIFEST.read_text() == render_crd_yaml(), f"{MANIFEST} {REGENERATE}"
    assert CHART_TEMPLATE.read_text() == render_chart_crd_template(), f"{CHART_TEMPLATE} {REGENERATE}"


def _walk(schema, path="spec"):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_schema_is_structural():
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        assert not {"$ref", "$defs", "title", "const", "anyOf", "oneOf"} & set(node), path
        assert node.get("type") != "null", path
        untyped = node.get("x-kubernetes-int-or-string") or (  # an untyped leaf may only be an enum's
            node.get("x-kubernetes-preserve-unknown-fields") and "enum" in node and "properties" not in node)
        assert "type" in node or untyped, f"{path} has no type"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert bound not in node or isinstance(node[bound], bool), path


def test_schema_has_defaults_enums_bounds_and_descriptions():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    training = spec["properties"]["training"]
    assert training["default"] == {}
    batch = training["properties"]["batchSizePerWorker"]
    # An int or "auto": bounds for integers, the pattern for strings (a 1.20 structural schema, no oneOf).
    assert (batch["minimum"], batch["maximum"], batch["pattern"], batch["default"]) == (1, 65536, "^auto$", 32)
    assert batch["x-kubernetes-int-or-string"] is True and "type" not in batch
    assert training["properties"]["input"]["default"] == {}
    assert training["properties"]["learningRateScaling"]["enum"] == ["linear", "sqrt", "none"]
    assert training["properties"]["earlyStopping"]["properties"]["restoreBestWeights"]["default"] is True
    dataset = spec["properties"]["dataset"]
    assert dataset["required"] == ["source", "output"]
    vf = dataset["properties"]["validationFraction"]
    assert (vf["minimum"], vf["exclusiveMinimum"], vf["maximum"], vf["exclusiveMaximum"]) == (0, True, 1, True)
    assert spec["properties"]["model"]["properties"]["base"]["enum"] == ["efficientnet_lite0", "mobilenet_v2", "xception"]
    assert spec["properties"]["workers"]["properties"]["cpu"]["x-kubernetes-int-or-string"] is True
    launcher = spec["properties"]["launcher"]
    assert launcher["default"] == {} and launcher["properties"]["resources"]["default"] == {}
    launcher_resources = launcher["properties"]["resources"]["properties"]
    assert (launcher_resources["cpu"]["default"], launcher_resources["memory"]["default"]) == ("100m", "256Mi")
    assert launcher_resources["cpu"]["x-kubernetes-int-or-string"] is True
    # optional objects without defaults must not be defaulted into existence
    assert "default" not in spec["properties"]["tracking"]
    for path, node in _walk(spec):
        if path.endswith(".*"):  # map values (nodeSelector) are described by their map
            continue
        assert node.get("description"), f"{path} has no description for kubectl explain"


def test_printer_columns_and_names():
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Workers", "Epoch", "Best-Epoch", "Val-Accuracy", "Age"]
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["srun"]
    assert crd["metadata"]["name"] == "scalingruns.scalingrun.dev"


def test_chart_template_is_the_same_crd():
    text = CHART_TEMPLATE.read_text()
    plain = "\n".join(line for line in text.splitlines() if "{{" not in line and "helm.sh" not in line
                      and line != "  annotations:")  # the CRD's own (crds.keep), not a property
    assert yaml.safe_load(plain) == build_crd()


def test_quantities_positive_strings_non_empty_and_name_limited_at_admission():
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    workers = root["properties"]["spec"]["properties"]["workers"]["properties"]
    for quantity in (workers["cpu"], workers["memory"]):
        assert quantity["x-kubernetes-int-or-string"] is True and quantity["minimum"] == 1
        assert [bool(re.match(quantity["pattern"], q)) for q in ("500m", "0.5", "16Gi", "0", "0m", "0.0Gi", "-1")] \
            == [True, True, True, False, False, False, False]
    assert workers["image"]["minLength"] == 1 and workers["nodeSelector"]["additionalProperties"]["minLength"] == 1
    assert root["properties"]["metadata"]["properties"]["name"]["maxLength"] == 40


def test_sweep_crd_checked_in_structural_and_in_the_chart():
    from scalingrun_operator.schema.crd import build_sweep_crd, render_chart_sweep_crd_template, render_sweep_crd_yaml

    manifest = ROOT / "manifests/crd/scalingrun.dev_scalingsweeps.yaml"
    template = ROOT / "charts/scalingrun/templates/crd-scalingsweep.yaml"
    assert manifest.read_text() == render_sweep_crd_yaml(), f"{manifest} {REGENERATE}"
    assert template.read_text() == render_chart_sweep_crd_template(), f"{template} {REGENERATE}"
    crd = build_sweep_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        assert not {"$ref", "$defs", "title", "const", "anyOf", "oneOf"} & set(node), path
        untyped = node.get("x-kubernetes-int-or-string") or (  # an untyped leaf may only be an enum's
            node.get("x-kubernetes-preserve-unknown-fields") and "enum" in node and "properties" not in node)
        assert "type" in node or untyped, f"{path} has no type"
    for key in ("spec", "status"):
        for path, node in _walk(root["properties"][key], key):
            if not path.endswith((".*", "[]")):  # map values and list items are described by their field
                assert node.get("description"), f"{path} has no description for kubectl explain"
    plain = "\n".join(line for line in template.read_text().splitlines() if "{{" not in line and "helm.sh" not in line
                      and line != "  annotations:")  # the CRD's own (crds.keep), not a property
    assert yaml.safe_load(plain) == crd


# YAML 1.1 booleans: PyYAML's, and go-yaml's (kubectl) y and n besides.
YAML_BOOLEAN_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false"}


def test_a_spec_word_that_yaml_reads_as_a_boolean_admits_the_boolean():
    """An enum word such as `off`, written unquoted, arrives as a boolean: the CRD must admit it (and the model
    takes it as meant: tests/integration/test_crd_apiserver.py); status is the operator's, not a user's YAML."""
    from scalingrun_operator.schema.crd import build_sweep_crd

    found = []
    for crd in (build_crd(), build_sweep_crd()):
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        for path, node in _walk(spec):
            words = [w for w in node.get("enum", []) if isinstance(w, str) and w.lower() in YAML_BOOLEAN_WORDS]
            for word in words:
                found.append(path)
                meant = word.lower() in ("y", "yes", "on", "true")
                assert meant in node["enum"], f"{path}: {word!r} arrives as {meant}, which the CRD refuses"
    assert found == ["spec.training.featureCache", "spec.template.training.featureCache"]
