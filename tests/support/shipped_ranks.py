"""A shipped function's ranks run one by one, as the launcher starts each (its rank in the environment): what the
HorovodRunner tests check of every rank when horovodrun stops the others at the first failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def each_rank_fails_alone(shipped: Path, named: str, processes: int = 2) -> None:
    """Each rank of the function shipped to `shipped` exits 1 with `named` (a regular expression) on its stderr and
    as the last line of its error file; rank 0 leaves no return value."""
    for left in shipped.glob("error.*.txt"):
        left.unlink()
    for rank in range(processes):
        env = {**os.environ, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(processes),
               "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        done = subprocess.run([sys.executable, "-m", "scalingrun_trainer.sdk.function", str(shipped)], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 1 and re.search(named, done.stderr), done.stderr
        assert re.fullmatch(named, (shipped / f"error.{rank}.txt").read_text().splitlines()[-1])
    assert not (shipped / "result.pkl").exists()
