"""`python -m scalingrun_trainer.sdk.function FOLDER [--digest sha256:...] [--ddp-world]`: one rank of a
shipped function (`scalingrun.HorovodRunner`, `scalingrun.LightningRunner`). FOLDER is a path, or a URI in the
run's store (s3://, file://) for a ScalingRun.

Every rank checks the payload's digest (the one on its command line, which the run's spec carries; else the
folder's), installs its packages and unpacks its shipped directory first on sys.path (sdk/packages.py: once a
machine, cached per list and per archive), unpacks the function
(scalingrun_api.shipped) and calls it with its keyword arguments; rank 0 pickles the return value to
FOLDER/result.pkl (a ScalingRun succeeds on its MPIJob's success). A function that reports through the SDK
(sdk.context(), sdk.KerasCallback(), report_epoch) has its progress document ended here as a script's sdk.finish()
or escaping exception would end it, so that status has its epochs and metrics; in a ScalingRun, rank 0 of one that
did not use the SDK ends an empty document: either way the run ends as the function returns. A rank whose packages
cannot be installed (pip's last lines, then the packages named) or whose function raises (its traceback) writes
that to FOLDER/error.<rank>.txt (and stderr) and exits 1, so that the launcher stops the others and the caller
names it. Under Horovod the function sets up its engine itself, as the articles' `train_hvd` does (`hvd.init()`);
with `--ddp-world` (under mpirun) it runs inside torch.distributed's process group over the MPI world
(sdk.lightning_world.ddp_world), which a Lightning Trainer's DDP uses.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tarfile
import traceback
from contextlib import nullcontext

from scalingrun_api.shipped import DIGEST_FILE, ERROR_FILE, PAYLOAD_FILE, RESULT_FILE, ShippedError, load, open_payload
from scalingrun_api.shipped_code import ShippedCodeError
from ..core.session import error_line
from ..storage import Location, open_location
from . import packages
from .context import CONFIG_VARIABLE, ContextError, ranks
from .run import context, started_session

FAILED, REFUSED = 1, 2


def _dumps(value: object) -> bytes:
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(value)
    return cloudpickle.dumps(value)


def _read(folder: Location, name: str) -> bytes:
    with folder.fs.open_input_stream(f"{folder.path}/{name}") as stream:
        return stream.read()


def _write(folder: Location, name: str, data: bytes) -> None:
    with folder.fs.open_output_stream(f"{folder.path}/{name}") as stream:
        stream.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalingrun_trainer.sdk.function")
    parser.add_argument("folder")
    parser.add_argument("--digest", help="the payload's digest (else the folder's function.sha256)")
    parser.add_argument("--ddp-world", action="store_true",
                        help="torch.distributed's process group set up around the function (LightningRunner)")
    args = parser.parse_args(argv)
    # The pods' store settings (builders.common.storage_env); none for a path.
    folder = open_location(args.folder, os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_DEFAULT_REGION"))
    rank = ranks()[0]
    try:
        expected = args.digest or _read(folder, DIGEST_FILE).decode().strip()
        shipped = open_payload(_read(folder, PAYLOAD_FILE), expected)
    except (OSError, ShippedError) as exc:
        print(f"rank {rank}: the shipped function in {args.folder}: {exc}", file=sys.stderr, flush=True)
        _write(folder, ERROR_FILE.format(rank=rank), f"{type(exc).__name__}: {exc}\n".encode())
        return REFUSED
    if shipped["packages"]:
        try:
            installed, ran_pip = packages.install(shipped["packages"])
        except (packages.PackagesError, OSError) as exc:  # OSError: a cache it cannot write
            print(f"rank {rank}: {exc}", file=sys.stderr, flush=True)
            _write(folder, ERROR_FILE.format(rank=rank), f"{exc}\n".encode())
            return FAILED
        packages.use(installed)
        print(f"rank {rank}: packages {'installed into' if ran_pip else 'reused from'} {installed}", file=sys.stderr,
              flush=True)
    if shipped.get("code"):
        try:
            unpacked, fresh = packages.unpack_code(shipped["code"])
        except (ShippedCodeError, OSError, EOFError, tarfile.TarError) as exc:
            print(f"rank {rank}: the shipped code: {exc}", file=sys.stderr, flush=True)
            _write(folder, ERROR_FILE.format(rank=rank), f"the shipped code: {exc}\n".encode())
            return REFUSED
        packages.use(unpacked)
        print(f"rank {rank}: shipped code {'unpacked into' if fresh else 'reused from'} {unpacked}", file=sys.stderr,
              flush=True)
    try:
        function, kwargs = load(shipped)
        with _world(args.ddp_world):
            value = function(**kwargs)
    except BaseException as exc:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        _write(folder, ERROR_FILE.format(rank=rank), text.encode())
        _end_reporting(error_line(exc), rank)
        return FAILED
    if rank == 0:
        _write(folder, RESULT_FILE, _dumps(value))  # before the document says succeeded: the caller reads it then
    _end_reporting(None, rank)
    return 0


def _end_reporting(error: str | None, rank: int) -> None:
    """The SDK session the function started ended: succeeded (a no-op after its own sdk.finish()) or failed with
    the function's error. In a ScalingRun (its trainer config named) rank 0 of a function that never used the SDK
    starts one to end it succeeded: else the operator, finding no final progress document, waits out its
    completion grace before the run Succeeds."""
    session = started_session()
    if session is None and error is None and rank == 0 and os.environ.get(CONFIG_VARIABLE):
        try:
            context()
        except (ContextError, ValueError, OSError) as exc:  # the run still succeeds on its MPIJob's success
            print(f"rank 0: the run's progress document not ended: {exc}", file=sys.stderr, flush=True)
        session = started_session()
    if session is None:
        return
    try:
        if error is None:
            session.finish()
        else:
            session.fail(error)
    except Exception as exc:  # noqa: BLE001 - the rank's exit code still says how the function ended
        print(f"rank {rank}: the run's progress document not ended: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)


def _world(ddp: bool):
    if ddp:
        from .lightning_world import ddp_world

        return ddp_world()
    return nullcontext()


if __name__ == "__main__":
    sys.exit(main())
