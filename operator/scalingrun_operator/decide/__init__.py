"""decide: what the operator and the local runner do about a ScalingRun or a ScalingSweep, as pure functions.

`decide_run` (run.py) and `decide_sweep` (sweep.py) take a Snapshot (the object as read, the time of
the look, the facts read so far) and return a Decision (children to create or patch, the status
patch, Events, when to look again). Nothing here calls the API server or storage, reads a clock or
keeps state between calls; tests/unit/operator/test_structure.py checks the imports.
"""
