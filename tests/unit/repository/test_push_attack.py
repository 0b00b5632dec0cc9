"""tests/support/push_attack.py and its pod's script (tests/support/push_attacker.py), without a cluster: the plans
and the pod, the script itself against a local HTTPS server, the tallies, the peak RSS read, the victim's record."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from scalingrun_api.status_push import CA_FILE, HEARTBEAT, PROGRESS, STATUS_AUDIENCE, TOKEN_FILE, URL_FILE, push_path
from tests.support.push_attack import (
    BAD_TOKEN, FORGED_EPOCH, FORGED_MODEL_URI, GARBAGE, MADE_UP, MADE_UP_NAMES, SCRIPT, VALID, VICTIM_HEARTBEAT,
    VICTIM_PROGRESS, Seen, answers, attacker_pod, by_status, peak_rss_mib, plans,
)
from tests.support.tls import write_serving_certificate


def test_the_garbage_attacker_targets_the_victim_and_the_valid_one_made_up_names_and_the_victim():
    found = plans("tenant", "victim")
    assert found[GARBAGE]["token"] == "garbage" and found[VALID]["token"] == "own"
    victim = {push_path("tenant", "victim", PROGRESS), push_path("tenant", "victim", HEARTBEAT)}
    assert {p for t in found[GARBAGE]["targets"].values() for p in t["paths"]} == victim
    made_up = set(found[VALID]["targets"][MADE_UP]["paths"])
    assert len(made_up) == MADE_UP_NAMES and not made_up & victim
    forged = found[VALID]["targets"][VICTIM_PROGRESS]
    assert forged["paths"] == [push_path("tenant", "victim", PROGRESS)]
    assert (forged["body"]["epoch"], forged["body"]["modelUri"]) == (FORGED_EPOCH, FORGED_MODEL_URI)
    assert found[VALID]["targets"][VICTIM_HEARTBEAT]["paths"] == [push_path("tenant", "victim", HEARTBEAT)]


def test_the_attacker_pod_mounts_its_own_status_token_and_runs_the_script_under_a_small_cpu_limit():
    pod = attacker_pod("attacker-valid-x", "trainer:1", plans("tenant", "victim")[VALID])
    container, = pod["spec"]["containers"]
    assert container["command"][:3] == ["python", "-c", SCRIPT.read_text()]
    assert json.loads(container["command"][3])["token"] == "own"
    assert len(container["command"][3]) < 128 * 1024  # Linux's bound on one argument (MAX_ARG_STRLEN)
    assert container["resources"]["limits"]["cpu"] == "50m"
    sources = pod["spec"]["volumes"][0]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["audience"] == STATUS_AUDIENCE
    assert "scalingrun.dev/run" not in pod["metadata"]["labels"]  # a pod of no run


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers as the status endpoint would: 404 for made-up names, 403 for the victim, 401 without a real token."""
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        token = self.headers["Authorization"].removeprefix("Bearer ")
        self.seen.append((self.path, token))
        status = 401 if token != "pod-token" else 404 if "/made-up-" in self.path else 403
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def test_the_script_pushes_every_target_over_tls_and_reports_its_answers(tmp_path: Path):
    write_serving_certificate(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / URL_FILE).write_text(f"https://127.0.0.1:{server.server_address[1]}/\n")
    (tmp_path / TOKEN_FILE).write_text("pod-token")
    (tmp_path / CA_FILE).write_bytes((tmp_path / "ca.crt").read_bytes())  # write_serving_certificate's name
    counts = {}
    try:
        for plan in ({**plans("tenant", "victim")[VALID], "dir": str(tmp_path), "report_every": 0.5},
                     {**plans("tenant", "victim")[GARBAGE], "dir": str(tmp_path), "report_every": 0.5}):
            process = subprocess.Popen([sys.executable, "-c", SCRIPT.read_text(), json.dumps(plan)],
                                       stdout=subprocess.PIPE, text=True)
            try:
                line = process.stdout.readline()
            finally:
                process.kill()
                process.wait()
            counts[plan["token"]] = answers(line)
    finally:
        server.shutdown()
    valid, garbage = counts["own"], counts["garbage"]
    assert {k.rsplit(" ", 1)[0] for k in valid} == {MADE_UP, VICTIM_PROGRESS, VICTIM_HEARTBEAT}, valid
    assert valid[f"{MADE_UP} 404"] > 0 and valid[f"{VICTIM_PROGRESS} 403"] > 0, valid
    assert set(by_status(garbage)) == {"401"} and garbage[f"{BAD_TOKEN}-heartbeat 401"] > 0, garbage
    tokens = {token for path, token in _Answers.seen if token != "pod-token"}
    assert len(tokens) > 1  # a new garbage token each push


def test_answers_are_the_last_report_line_and_tallied_by_status():
    log = ('waiting for the status endpoint\'s URL\n{"answers": {"made-up 404": 1}}\n'
           '{"answers": {"made-up 404": 5, "victim-progress 403": 2, "bad-token 429": 1}}\n')
    assert answers(log) == Counter({"made-up 404": 5, "victim-progress 403": 2, "bad-token 429": 1})
    assert by_status(answers(log)) == Counter({"404": 5, "403": 2, "429": 1})
    assert answers("no report yet\n") == Counter()


def test_the_peak_rss_is_the_high_water_mark_in_mib():
    assert peak_rss_mib("Name:\tscalingrun\nVmPeak:\t 900000 kB\nVmHWM:\t  262144 kB\nVmRSS:\t 100 kB\n") == 256


def test_the_victims_record_catches_a_stall_the_forged_epoch_and_the_forged_model():
    seen = Seen()
    seen.record({"status": {"training": {"epoch": 1, "heartbeat": {"epoch": 1}}}})
    assert not seen.stalled and seen.epochs == {1} and seen.heartbeat_epochs == {1} and not seen.model_uris
    seen.record({"status": {"conditions": [{"type": "Stalled", "status": "True"}], "modelUri": FORGED_MODEL_URI,
                            "training": {"epoch": FORGED_EPOCH, "heartbeat": {"epoch": FORGED_EPOCH}}}})
    assert seen.stalled and FORGED_EPOCH in seen.epochs and FORGED_MODEL_URI in seen.model_uris
    assert FORGED_EPOCH in seen.heartbeat_epochs
