"""`python -m scalingrun_trainer.sdk.function FOLDER`: one rank of a shipped function (`scalingrun.HorovodRunner`).

Every rank checks the payload's digest, unpacks the function (scalingrun_api.shipped) and calls it with its keyword
arguments; rank 0 pickles the return value to FOLDER/result.pkl. A rank whose function raises writes its traceback
to FOLDER/error.<rank>.txt (and stderr) and exits 1, so that the launcher stops the others and the caller names it.
The function sets up its engine itself, as the articles' `train_hvd` does (`hvd.init()`).
"""

from __future__ import annotations

import pickle
import sys
import traceback
from pathlib import Path

from scalingrun_api.shipped import DIGEST_FILE, ERROR_FILE, PAYLOAD_FILE, RESULT_FILE, ShippedError, unpack
from .context import ranks

FAILED, REFUSED = 1, 2


def _dumps(value: object) -> bytes:
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(value)
    return cloudpickle.dumps(value)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scalingrun_trainer.sdk.function FOLDER", file=sys.stderr)
        return REFUSED
    folder = Path(args[0])
    rank = ranks()[0]
    try:
        function, kwargs = unpack((folder / PAYLOAD_FILE).read_bytes(), (folder / DIGEST_FILE).read_text().strip())
    except (OSError, ShippedError) as exc:
        print(f"rank {rank}: the shipped function in {folder}: {exc}", file=sys.stderr, flush=True)
        (folder / ERROR_FILE.format(rank=rank)).write_text(f"{type(exc).__name__}: {exc}\n")
        return REFUSED
    try:
        value = function(**kwargs)
    except BaseException:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        (folder / ERROR_FILE.format(rank=rank)).write_text(text)
        return FAILED
    if rank == 0:
        partial = folder / (RESULT_FILE + ".tmp")
        partial.write_bytes(_dumps(value))
        partial.replace(folder / RESULT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
