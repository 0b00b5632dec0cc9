"""The push path's contract, shared by the operator's status server and the trainer's client: where a run's pod
finds what it pushes with, the token's audience, the routes and the body cap.

The operator mounts into every pod it creates a projected ServiceAccount token of audience STATUS_AUDIENCE (rotated
by the kubelet) and, from the ConfigMap STATUS_CONFIG_MAP of the run's namespace (optional: an operator without the
status server writes none), the server's URL and CA bundle, all in STATUS_DIR. A pod that finds no URL there pushes
nothing (local runs, older operators).
"""

from __future__ import annotations

STATUS_AUDIENCE = "scalingrun.dev/status"
STATUS_DIR = "/var/run/scalingrun.dev/status"
STATUS_DIR_VARIABLE = "SCALINGRUN_STATUS_DIR"  # the trainer reads STATUS_DIR from here (tests point it elsewhere)
TOKEN_FILE, URL_FILE, CA_FILE = "token", "url", "ca.crt"
STATUS_PATH_VARIABLE = "SCALINGRUN_STATUS_PATH"  # the run's push path, /v1/namespaces/<ns>/scalingruns/<run>
STATUS_CONFIG_MAP = "scalingrun-status"
# The kubelet rotates the token at 80 % of its life; 1 h is the longest the push path needs.
TOKEN_EXPIRATION_SECONDS = 3600
MAX_BODY_BYTES = 64 * 1024
# What a push carries (a full state document each time, the same JSON the trainer writes to storage). The one
# spelling of these kinds: the trainer pushes under them, the server routes them, and decide asks for them.
PROGRESS, HEARTBEAT = "progress", "heartbeat"
PUSHED_DOCUMENTS = (PROGRESS, HEARTBEAT)


def run_push_path(namespace: str, run: str) -> str:
    """The run's push path (STATUS_PATH_VARIABLE's value); a document goes under it (push_path)."""
    return f"/v1/namespaces/{namespace}/scalingruns/{run}"


def push_path(namespace: str, run: str, what: str) -> str:
    return f"{run_push_path(namespace, run)}/{what}"
