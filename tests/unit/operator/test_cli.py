"""`scalingrun` with kubectl's and helm's habits (issue 31, item 6): one-line errors and exit codes 0/1/2,
--version, a description and an example per subcommand, -f DIR / several documents / kind: List with other
kinds skipped and named, -o json|yaml without anchors, quantities in words, completion scripts."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalingrun_operator.cli import build_parser, main
from scalingrun_operator.cli.completion import SHELLS, model
from tests.support.specs import MINIMAL

ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "examples/sweep.yaml"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "my-s3"}, "stringData": {"k": "v"}}
# Every command that reads -f, as a user types it.
READERS = [["validate"], ["render"], ["run", "--local"], ["sweep", "--local"], ["report"]]


def named(name: str) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["name"] = name
    return doc


def subcommands() -> dict:
    return next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
@pytest.mark.parametrize("content, says", [
    (None, "missing.yaml: no such file or directory"),
    ("spec: [unclosed\n", "not valid YAML (line 2, column 1)"),
    ("", "no ScalingRun or ScalingSweep found"),
    ("---\n# nothing\n---\n", "no ScalingRun or ScalingSweep found"),
], ids=["missing", "bad-yaml", "empty", "only-separators"])
def test_a_users_file_mistake_is_one_line_and_exit_1(tmp_path, capsys, command, content, says):
    path = tmp_path / "missing.yaml"
    if content is not None:
        path.write_text(content)
    assert main([*command, "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert says in captured.err and captured.err.count("\n") == 1 and captured.out == ""


def test_no_traceback_from_the_installed_command(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ScalingRun\nspec: {dataset: [\n")
    result = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "render", "-f", str(bad)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{bad}: not valid YAML")


def test_usage_mistakes_exit_2(capsys):
    for argv in (["render"], ["no-such-command"], ["render", "-f", "x.yaml", "-o", "wide"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
        capsys.readouterr()
    assert main(["report"]) == 2
    assert main(["report", "-f", str(SWEEP), "--progress", "p.json"]) == 2


def test_exit_codes_are_in_the_help_and_the_docs(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    for line in ("exit codes:", "  0  done", "  1  failed", "  2  usage"):
        assert line in help_text
    docs = (ROOT / "docs/command-line.md").read_text()
    assert "| 2 | usage" in docs and "| 1 | failed" in docs and "| 0 | done" in docs
    # The cases of `logs` too, in both (they were in the page only).
    words = " ".join(help_text.split())
    for case in ("a run not found", "a log neither live nor archived", "a store that cannot be read",
                 "ended with Ctrl-C: 130"):
        assert case in words and case in " ".join(docs.split()), case


def test_version_names_the_package_and_the_api(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("scalingrun ") and "(API scalingrun.dev/v1alpha1)" in out


def test_every_subcommand_has_a_description_and_an_example():
    for name, parser in subcommands().items():
        assert parser.description and len(parser.description) > 30, name
        assert (parser.epilog or "").startswith("examples:\n") and f"scalingrun {name}" in parser.epilog, name
        assert f"scalingrun {name}" in parser.format_help()


def test_a_folder_is_read_like_kubectl_apply_f_dir(tmp_path, capsys):
    (tmp_path / "a-run.yaml").write_text(yaml.safe_dump(named("first")))
    (tmp_path / "b-run.yml").write_text(yaml.safe_dump(named("second")))
    (tmp_path / "c-secret.json").write_text(json.dumps(SECRET))
    (tmp_path / "notes.txt").write_text("not: [yaml")
    assert main(["validate", "-f", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "ScalingRun first is valid" in captured.out and "ScalingRun second is valid" in captured.out
    assert "skipped Secret/my-s3: not a ScalingRun or ScalingSweep" in captured.err
    assert "notes.txt" not in captured.out + captured.err
    assert main(["validate", "-f", str(tmp_path / "nothing-here")]) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["render", "-f", str(empty)]) == 1
    assert "no *.yaml, *.yml or *.json file in this folder" in capsys.readouterr().err


def test_several_documents_and_a_kind_list_with_other_kinds_skipped(tmp_path, capsys):
    path = tmp_path / "all.yaml"
    listed = {"apiVersion": "v1", "kind": "List", "items": [named("one"), named("two"), SECRET]}
    path.write_text(yaml.safe_dump_all([SECRET, listed, None, named("three")]))
    assert main(["render", "-f", str(path), "-o", "json"]) == 0
    captured = capsys.readouterr()
    jobs = [o["metadata"]["name"] for o in json.loads(captured.out)["items"] if o["kind"] == "MPIJob"]
    assert sorted(jobs) == ["one-train", "three-train", "two-train"]
    assert captured.err.count("skipped Secret/my-s3: not a ScalingRun or ScalingSweep") == 2


def test_our_group_with_a_misspelt_kind_is_reported_not_skipped(tmp_path, capsys):
    doc = named("typo")
    doc["kind"] = "ScalingRuns"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "-f", str(path)]) == 1
    assert "kind: Input should be 'ScalingRun'" in capsys.readouterr().err


def test_a_sweep_given_to_run_is_told_to_use_sweep(tmp_path, capsys):
    assert main(["run", "--local", "-f", str(SWEEP)]) == 2
    err = capsys.readouterr().err
    told = f"ScalingSweep/flowers-sweep is a ScalingSweep, not a ScalingRun: use `scalingrun sweep --local -f {SWEEP}`"
    assert told in err and err.count("\n") == 1
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(named("solo")))
    assert main(["sweep", "--local", "-f", str(run)]) == 2
    assert "use `scalingrun run --local -f" in capsys.readouterr().err
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([named("a"), named("b")]))
    assert main(["run", "--local", "-f", str(two)]) == 2
    assert "expected one ScalingRun, found 2: ScalingRun/a, ScalingRun/b" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("cpu", 0), ("cpu", "0"), ("memory", "lots"), ("cpu", "-1")])
def test_a_bad_quantity_is_explained_in_words(tmp_path, capsys, field, value):
    doc = named("q")
    doc["spec"]["workers"] = {field: value}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"spec.workers.{field}: must be a positive quantity such as 500m, 2 or 16Gi (got '{value}')" in err
    assert "[0-9]" not in err


def test_render_json_and_yaml_agree_and_yaml_has_no_anchors(capsys):
    quickstart = str(ROOT / "examples/quickstart.yaml")
    assert main(["render", "-f", quickstart, "-n", "team-a"]) == 0
    as_yaml = capsys.readouterr().out
    assert main(["render", "-f", quickstart, "-n", "team-a", "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["kind"] == "List" and list(yaml.safe_load_all(as_yaml)) == as_json["items"]
    assert "&id" not in as_yaml and "*id" not in as_yaml
    assert main(["crd", "-o", "json"]) == 0
    crds = json.loads(capsys.readouterr().out)
    assert [c["spec"]["names"]["kind"] for c in crds["items"]] == ["ScalingRun", "ScalingSweep"]


def test_yaml_output_writes_a_shared_object_twice_not_as_an_alias():
    from scalingrun_operator.cli.loading import dump

    shared = {"cpu": "1"}
    text = dump([{"a": shared, "b": shared}], "yaml")
    assert "&" not in text and yaml.safe_load(text) == {"a": shared, "b": shared}


def _bash_complete(script: str, words: list[str]) -> list[str]:
    """COMPREPLY of the generated bash function for the words typed so far (the last one being completed)."""
    program = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
               "_scalingrun; printf '%s\\n' \"${COMPREPLY[@]}\"")
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completion_completes_commands_flags_and_values(tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert _bash_complete(script, ["scalingrun", "re"]) == ["render", "report"]
    assert _bash_complete(script, ["scalingrun", "render", "-o", ""]) == ["yaml", "json"]
    assert "--namespace" in _bash_complete(script, ["scalingrun", "render", "--"])
    assert _bash_complete(script, ["scalingrun", "completion", "z"]) == ["zsh"]
    for name in ("run-a.yaml", "run-b.yml", "other.yaml"):
        (tmp_path / name).write_text("")
    (tmp_path / "reports").mkdir()
    assert _bash_complete(script, ["scalingrun", "report", "-o", str(tmp_path / "r")]) == [str(tmp_path / "reports")]
    assert sorted(_bash_complete(script, ["scalingrun", "validate", "-f", str(tmp_path / "ru")])) == [
        str(tmp_path / "run-a.yaml"), str(tmp_path / "run-b.yml")]


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_every_shell_script_names_every_command_and_flag(capsys, shell):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    _, commands = model(build_parser())
    for command in commands:
        assert command.name in script
        for option in command.options:
            for flag in option.flags:
                assert (flag if shell != "fish" else (f"-l {flag[2:]}" if flag.startswith("--") else
                                                      f"-s {flag[1:]}")) in script, (command.name, flag)
    quoted = {"bash": "run's", "zsh": "run'\\''s", "fish": "run\\'s"}[shell]  # the report's "a run's curves"
    assert shell == "bash" or quoted in script


def test_an_unquoted_off_for_the_feature_cache_is_taken_as_meant(tmp_path, capsys):
    doc = named("cache")
    path = tmp_path / "cache.yaml"
    path.write_text(yaml.safe_dump(doc) + "  training:\n    featureCache: off\n")
    assert yaml.safe_load(path.read_text())["spec"]["training"]["featureCache"] is False  # YAML 1.1
    assert main(["validate", "-f", str(path)]) == 0
    assert "ScalingRun cache is valid" in capsys.readouterr().out
    assert main(["render", "-f", str(path), "-o", "json"]) == 0
    config_map = next(o for o in json.loads(capsys.readouterr().out)["items"] if o["kind"] == "ConfigMap")
    assert json.loads(config_map["data"]["config.json"])["training"]["featureCache"] == "off"


def test_a_boolean_where_a_word_is_due_is_explained_as_yaml_quoting(tmp_path, capsys):
    doc = named("selector")
    doc["spec"]["workers"] = {"nodeSelector": {"gpu": True}}
    path = tmp_path / "selector.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.workers.nodeSelector.gpu: Input should be a valid string (got True): YAML reads an unquoted yes, " \
           "no, on, off, true or false as a boolean; quote the word" in err


def test_run_and_sweep_without_local_say_what_to_do_in_a_cluster(capsys):
    assert main(["run", "-f", "my-run.yaml"]) == 2
    assert "only --local is supported (on this machine); in a cluster, kubectl apply -f my-run.yaml" in \
        capsys.readouterr().err
    assert main(["sweep", "-f", str(SWEEP)]) == 2


def test_stdin_is_read_with_dash(monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all([SECRET, named("piped")])))
    assert main(["validate", "-f", "-"]) == 0
    captured = capsys.readouterr()
    assert "-: ScalingRun piped is valid" in captured.out and "-: skipped Secret/my-s3" in captured.err


def test_as_a_kubectl_plugin_it_names_itself_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/kubectl-scalingrun"])
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    assert capsys.readouterr().out.startswith("usage: kubectl scalingrun validate")
    assert 'kubectl-scalingrun = "scalingrun_operator.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_a_reader_that_leaves_early_is_no_error(tmp_path, monkeypatch):
    """`scalingrun render ... | head`: the write breaks (EPIPE); no traceback, exit 0, as kubectl."""
    import io
    import os

    class LeftReader(io.StringIO):
        def __init__(self, fd: int):
            super().__init__()
            self.fd = fd

        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return self.fd

    descriptor = os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(sys, "stdout", LeftReader(descriptor))
    try:
        assert main(["render", "-f", str(SWEEP)]) == 0
    finally:
        os.close(descriptor)


def test_validate_goes_on_past_a_bad_file_in_a_folder(tmp_path, capsys):
    (tmp_path / "a-broken.yaml").write_text("spec: [unclosed\n")
    (tmp_path / "b-empty.yaml").write_text("")
    (tmp_path / "c-run.yaml").write_text(yaml.safe_dump(named("after")))
    assert main(["validate", "-f", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "ScalingRun after is valid" in captured.out
    assert "a-broken.yaml: not valid YAML" in captured.err and "b-empty" not in captured.err  # as kubectl: skipped
