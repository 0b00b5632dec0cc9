"""Checkpoints in the run's storage, `<runLocation>/checkpoints/`, for every engine: one `epoch-NNNNN/` folder of the
engine's files (the last one only) and `state.json`, the commit point, written after the files. A training resumes
from the epoch state.json names when its `trainedOn` facts (dataset, base, classes, input, engine) are this run's.
A checkpoint written on a preemption notice (core/preemption.py) is at a step inside the next epoch:
`epoch-NNNNN-step-NNNNN/`, and the training resumes at that step.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Optional

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from ..storage import Location

STATE_FILE = "state.json"


class _Document(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class EarlyStoppingState(_Document):
    """Early stopping's counters after the checkpoint's epoch (best_epoch 1-based)."""

    wait: int = 0
    best: Optional[float] = None
    best_epoch: Optional[int] = None


class CheckpointState(_Document):
    """state.json."""

    epoch: int  # epochs completed
    step: int = 0  # steps of the next epoch completed too (a checkpoint on a preemption notice)
    checkpoint: str  # the epoch-NNNNN folder
    prefix: Optional[str] = None  # a tf.train.Checkpoint's file prefix in it (Keras)
    early_stopping: Optional[EarlyStoppingState] = None
    best_weights: bool = False  # the folder holds early stopping's best weights too
    history: list[dict[str, Any]] = []  # progress.json's, to resume the document
    finished: bool = False  # a rerun of a finished run does not train again
    trained_on: Optional[dict[str, Any]] = None
    mlflow_run_id: Optional[str] = None  # the MLflow run a resumed training continues
    batch_size_probe: Optional[dict[str, Any]] = None  # a resumed auto batch size keeps its probe's choice
    # The world that wrote it: a resume at another size (issue 42) says so, and counts `step` in these updates.
    processes: Optional[int] = None
    effective_batch_size: Optional[int] = None

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


def epoch_folder(epoch: int, step: int = 0) -> str:
    return f"epoch-{epoch:05d}" + (f"-step-{step:05d}" if step else "")


class CheckpointStore:
    """`<runLocation>/checkpoints/`: state.json read on every rank; written by the one rank that commits (rank 0).
    The others' stores follow the same saves without writing, so that every rank takes the same decisions."""

    def __init__(self, root: Location, commit: bool = True):
        self.root, self.commit = root, commit
        self.last: Optional[CheckpointState] = None  # what this attempt saved last

    def load(self) -> Optional[CheckpointState]:
        state_at = self.root.join(STATE_FILE)
        if not state_at.exists():
            return None
        return CheckpointState.model_validate(json.loads(state_at.read_bytes()))

    def folder(self, state: CheckpointState) -> Location:
        return self.root.join(state.checkpoint)

    def save(self, epoch: int, files: Iterable[tuple[str, bytes]], *, history: list[dict],
             early_stopping: Optional[EarlyStoppingState], best_weights: bool, resume_facts: dict[str, Any],
             prefix: Optional[str] = None, finished: bool = False, step: int = 0) -> None:
        """Writes the engine's files for `epoch` (and `step` steps of the next), then state.json, then removes older
        checkpoints' folders; a store that does not commit only takes note (`files` is not read)."""
        folder = epoch_folder(epoch, step)
        if self.commit:
            for name, data in files:
                self.root.join(folder, name).write_bytes_atomic(data)
        self._commit(CheckpointState(epoch=epoch, step=step, checkpoint=folder, prefix=prefix, early_stopping=early_stopping,
                                     best_weights=best_weights, history=history, finished=finished, **resume_facts))
        if self.commit:
            self._remove_older(folder)

    def finish(self, epoch: int, save: Callable[[], None]) -> None:
        """Marks the run finished, so that a rerun of the same run does not train again: state.json again when the
        last checkpoint is this epoch's, else `save()` (which saves `epoch` with finished=True)."""
        if self.last is not None and self.last.epoch == epoch and not self.last.step:
            self._commit(self.last.model_copy(update={"finished": True}))
        else:
            save()

    def _commit(self, state: CheckpointState) -> None:
        if self.commit:
            self.root.join(STATE_FILE).write_bytes_atomic(json.dumps(state.document()).encode())
        self.last = state

    def _remove_older(self, keep: str) -> None:
        from pyarrow import fs as pafs

        for info in self.root.fs.get_file_info(pafs.FileSelector(self.root.path)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith("epoch-") and info.base_name != keep:
                self.root.fs.delete_dir(info.path)
