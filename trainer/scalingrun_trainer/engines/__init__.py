"""One package per engine, a row of scalingrun_api.engines each: a framework (frameworks/) plus how its processes
talk (Horovod, MultiWorkerMirroredStrategy, DDP). Their train(config) is what the trainer runs."""
