"""A shipped function (scalingrun_api.shipped): packed with cloudpickle or, without it, as source; unpacked only under
its digest; over the cap refused with the reason."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from scalingrun_api import shipped


def scaled_sum(values: list[int], scale: int) -> int:
    return sum(values) * scale


def test_a_function_and_its_arguments_come_back_under_their_digest():
    data = shipped.pack(scaled_sum, {"values": [1, 2, 3], "scale": 2})
    function, kwargs = shipped.unpack(data, shipped.digest(data))
    assert function(**kwargs) == 12
    captured = 5
    closure = shipped.pack(lambda offset: captured + offset, {"offset": 1})  # cloudpickle takes closures too
    function, kwargs = shipped.unpack(closure, shipped.digest(closure))
    assert function(**kwargs) == 6


def test_a_payload_whose_digest_differs_is_refused():
    data = shipped.pack(scaled_sum, {"values": [1], "scale": 1})
    other = shipped.digest(data + b"x")
    with pytest.raises(shipped.ShippedError, match=rf"digest is {shipped.digest(data)}, not {other}: refused"):
        shipped.unpack(data, other)


def test_arguments_over_the_cap_are_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(shipped, "MAX_PAYLOAD_BYTES", 1000)
    with pytest.raises(shipped.ShippedError, match=r"scaled_sum: the function and its arguments pickle to [\d,]+ "
                                                   r"bytes, over the cap of 1,000: pass data by path or URI"):
        shipped.pack(scaled_sum, {"values": list(range(1000)), "scale": 1})


def test_without_cloudpickle_a_function_goes_as_its_modules_source(tmp_path):
    (tmp_path / "teamcode.py").write_text(textwrap.dedent("""
        OFFSET = 100

        def shifted(value):
            return value + OFFSET
        """))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["cloudpickle"] = None  # not installed
        sys.path.insert(0, {str(tmp_path)!r})
        from scalingrun_api import shipped
        import teamcode
        data = shipped.pack(teamcode.shifted, {{"value": 1}})
        del sys.modules["teamcode"]; sys.path.pop(0)  # the ranks have no teamcode.py
        function, kwargs = shipped.unpack(data, shipped.digest(data))
        print(function(**kwargs), function.__module__)
        try:
            shipped.pack(lambda: 1, {{}})
        except shipped.ShippedError as exc:
            print(exc)
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "101 __scalingrun_shipped__",
        "<lambda>: without cloudpickle only a module-level function can be shipped (pip install cloudpickle to ship "
        "this one)"]


def test_the_package_list_is_part_of_what_the_digest_covers():
    plain = shipped.pack(scaled_sum, {"values": [1], "scale": 1})
    with_one = shipped.pack(scaled_sum, {"values": [1], "scale": 1}, ["pandas==2.2.3"])
    with_other = shipped.pack(scaled_sum, {"values": [1], "scale": 1}, ["pandas==2.2.2"])
    assert len({shipped.digest(plain), shipped.digest(with_one), shipped.digest(with_other)}) == 3
    assert shipped.open_payload(with_one, shipped.digest(with_one))["packages"] == ["pandas==2.2.3"]


@pytest.mark.parametrize("spec", ["pandas", "pandas==2.2.3", "scikit-learn>=1.4,<2", "ray[tune]~=2.9",
                                  "zope.interface!=6.0", "torch==2.3.0+cpu", "Pillow >= 10"])
def test_requirements_pass(spec):
    assert shipped.check_packages([spec]) == [spec]


@pytest.mark.parametrize(("packages", "reason"), [
    (["--index-url=https://evil.example/simple"], r"an option, not a package: refused"),
    (["-r/etc/passwd"], r"an option, not a package: refused"),
    ([" -e."], r"an option, not a package: refused"),
    (["pandas; python_version>'3'"], r"not a requirement \(a name, extras and version clauses"),
    (["pkg @ https://evil.example/pkg.whl"], r"not a requirement"),
    (["./wheels/pkg.whl"], r"not a requirement"),
    (["pandas==2 --index-url x"], r"not a requirement"),
    (["pandas && rm -rf /"], r"not a requirement"),
    ([""], r"not a requirement"),
    ([3], r"package 3: a requirement string"),
    ("pandas", r"packages='pandas': a list of requirements"),
    (["p" * 201], r"201 characters, over the cap of 200"),
    ([f"p{i}" for i in range(65)], r"65 packages, over the cap of 64"),
])
def test_a_package_list_that_is_not_requirements_is_refused_naming_the_package(packages, reason):
    with pytest.raises(shipped.ShippedError, match=reason):
        shipped.check_packages(packages)
    with pytest.raises(shipped.ShippedError, match=reason):  # before anything is packed or run
        shipped.pack(scaled_sum, {"values": [], "scale": 1}, packages)
