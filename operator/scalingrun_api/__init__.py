"""The scalingrun API shared by the operator and the trainers: the ScalingRun/ScalingSweep spec and status
models (the one source of truth; the CRDs are generated from them) and the trainer's progress document.

pydantic only: no kopf, no Kubernetes client, no TensorFlow, no torch. Both images carry it.
"""
