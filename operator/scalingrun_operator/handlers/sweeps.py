"""kopf handlers of ScalingSweeps: no finalizer, timer or daemon; the events of their points move them on."""

from __future__ import annotations

from typing import Any, Optional

import kopf

from scalingrun_api.models import GROUP, PLURAL, SWEEP_KIND, SWEEP_PLURAL, VERSION
from ..schema.sweep import SWEEP_LABEL
from ..decide.children import controller_name


@kopf.on.resume(GROUP, VERSION, SWEEP_PLURAL)
@kopf.on.create(GROUP, VERSION, SWEEP_PLURAL)
@kopf.on.update(GROUP, VERSION, SWEEP_PLURAL, field="spec")
def sweep_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.reconcile_sweep(namespace, name, "change")


@kopf.on.event(GROUP, VERSION, PLURAL, labels={SWEEP_LABEL: kopf.PRESENT})
def sweep_point_changed(type: Optional[str], body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A point's status moved (Preprocessed, Succeeded, Failed): start the next point, fill its row."""
    sweep = controller_name(dict(body), SWEEP_KIND)
    if sweep:
        memo.runtime.reconcile_sweep(namespace, sweep, "point")
