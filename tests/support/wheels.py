"""A pure-Python wheel written with the standard library's zipfile, as a build backend would: a package for pip to
install from a local folder with no index (HorovodRunner(packages=...) tests)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

PACKAGE = "scalingrun_tiny_answer"


def write_wheel(folder: Path, version: str = "1.0") -> str:
    """A wheel of PACKAGE (ANSWER = 42) in `folder`; its requirement. It depends on cloudpickle, which the test venv
    has and `folder` lacks."""
    distribution = f"{PACKAGE}-{version}"
    files = {f"{PACKAGE}/__init__.py": "ANSWER = 42\n",
             f"{distribution}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n"
                                                   "Requires-Dist: cloudpickle\n",
             f"{distribution}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: scalingrun-tests\n"
                                                "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for name, text in files.items()]
    files[f"{distribution}.dist-info/RECORD"] = "\n".join([*record, f"{distribution}.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{distribution}-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return f"{PACKAGE}=={version}"
