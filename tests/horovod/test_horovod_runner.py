"""scalingrun.HorovodRunner(np=-2): a function of this file shipped (by value) to two Horovod processes here; rank 0's
return value comes back, and a rank that raises is named with its traceback."""

from __future__ import annotations

import pytest

import scalingrun
from tests.support.horovodrun import horovodrun

pytestmark = pytest.mark.horovod


def allreduce_of_ranks(scale: float) -> dict:
    """Each rank adds rank + 1: the sum over 2 ranks is 3, times `scale`; rank 0 returns it."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total) * scale}


def fails_on_rank_1() -> None:
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 has no data")


def test_two_processes_here_return_rank_zeros_value(tmp_path, monkeypatch):
    horovodrun()  # skips where Horovod is not built
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    value = scalingrun.HorovodRunner(np=-2, workdir=tmp_path).run(allreduce_of_ranks, scale=10.0)
    assert value == {"rank": 0, "size": 2, "sum": 30.0}
    # The ranks found the function by digest in the folder it was shipped to, and rank 0 left its value there.
    shipped = next(tmp_path.iterdir())
    assert (shipped / "function.sha256").read_text().startswith("sha256:")
    assert (shipped / "result.pkl").exists()


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path, monkeypatch):
    horovodrun()
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with pytest.raises(scalingrun.HorovodRunnerError) as raised:
        scalingrun.HorovodRunner(np=-2, workdir=tmp_path, driver_log_verbosity="log_callback_only").run(fails_on_rank_1)
    first = str(raised.value).splitlines()[0]
    assert first == "rank 1 of 2 failed: ValueError: rank 1 has no data", str(raised.value)
    assert "in fails_on_rank_1" in str(raised.value)
