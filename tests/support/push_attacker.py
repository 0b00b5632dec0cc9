"""An attacker of the status endpoint, run in a pod by tests/support/push_attack.py (`python -c` this file's text,
its plan as the one argument, JSON): standard library only, as it runs in any image with Python.

The plan: `dir` and `files` ({"url", "ca", "token"}: their names), where the pod finds the endpoint's URL and CA
and its own projected token (as a run's pod does: scalingrun_api.status_push); `token`, "own" (that token, re-read each time: the kubelet rotates it) or
"garbage" (a random one each time); `targets`, {label: {"paths": [...], "body": {...}}}, each label in turn and its
paths in turn (one body a label: the plan is one argument, at most 128 KiB). It pushes as fast as its
CPU limit lets it, over one kept-alive connection, and every `report_every` seconds (default 5) prints its answers so
far as one JSON line, {"answers": {"<label> <HTTP status or error>": count}}.
"""

import base64
import http.client
import json
import os
import secrets
import ssl
import sys
import time
import urllib.parse

def garbage_token() -> str:
    part = lambda n: base64.urlsafe_b64encode(secrets.token_bytes(n)).decode().rstrip("=")  # noqa: E731
    return f"eyJhbGciOiJSUzI1NiJ9.{part(120)}.{part(256)}"


def read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name)) as f:
        return f.read().strip()


def main(plan: dict) -> None:
    folder, files = plan["dir"], plan["files"]
    while not os.path.exists(os.path.join(folder, files["url"])):  # the ConfigMap's projection may come a little later
        print("waiting for the status endpoint's URL", flush=True)
        time.sleep(2)
    url = urllib.parse.urlsplit(read(folder, files["url"]))
    context = ssl.create_default_context(cafile=os.path.join(folder, files["ca"]))
    by_label = {label: (target["paths"], json.dumps(target["body"]).encode())
                for label, target in sorted(plan["targets"].items())}
    answers: dict = {}
    connection, reported, turn = None, time.monotonic(), 0
    while True:
        for label, (paths, body) in by_label.items():
            path = paths[turn % len(paths)]
            token = read(folder, files["token"]) if plan["token"] == "own" else garbage_token()
            try:
                if connection is None:
                    connection = http.client.HTTPSConnection(url.hostname, url.port or 443, context=context,
                                                             timeout=30)
                connection.request("POST", url.path.rstrip("/") + path, body=body, headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                answer = str(response.status)
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                answer = type(exc).__name__
                if connection is not None:
                    connection.close()
                connection = None
            key = f"{label} {answer}"
            answers[key] = answers.get(key, 0) + 1
        turn += 1
        if time.monotonic() - reported > plan.get("report_every", 5.0):
            print(json.dumps({"answers": answers}), flush=True)
            reported = time.monotonic()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
