"""Handler logic, one module per concern: pure decisions (spec, dataset, training) and the
reconcile that reads the world, applies those decisions and writes status. main.py only wires kopf."""
