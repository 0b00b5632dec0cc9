"""The preemption notice on one rank (core/preemption.py): SIGTERM while training steps run is noted with the step
it came after; before them it ends the rank at once with PREEMPTED_EXIT_CODE; the rank's pid is noted for the
worker's entrypoint, and the note removed with the handler. The ranks' agreement is tested under mpirun
(tests/horovod/test_preemption.py)."""

from __future__ import annotations

import os
import signal

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from scalingrun_trainer.core.preemption import RANK_PIDS_DIR_ENV, PreemptionNotice


def test_sigterm_while_training_is_noted_with_the_step_and_before_training_ends_the_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(RANK_PIDS_DIR_ENV, str(tmp_path / "ranks"))
    left: list[int] = []
    notice = PreemptionNotice(left.append)
    notice.install()
    try:
        assert (tmp_path / "ranks" / str(os.getpid())).read_text() == str(os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)  # before the steps: nothing to save, the rank leaves
        assert left == [PREEMPTED_EXIT_CODE]

        notice.requested, left[:] = False, []
        notice.armed, notice.done = True, (1, 7)
        os.kill(os.getpid(), signal.SIGTERM)
        assert left == [] and notice.requested and notice.noticed_at == (1, 7)
        notice.done = (1, 8)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing: the first step it came after stays
        assert notice.noticed_at == (1, 7)
    finally:
        notice.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert not (tmp_path / "ranks" / str(os.getpid())).exists()
