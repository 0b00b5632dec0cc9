"""horovodrun for the tests (skips, CI excepted, where it is missing)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.support.env import require


def horovodrun() -> str:
    path = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    require(Path(path).exists(), "horovodrun not installed (run scripts/setup.sh)")
    return path
