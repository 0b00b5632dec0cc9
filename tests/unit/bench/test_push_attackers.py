"""bench/push_attackers.py's pure parts: the attackers' plan, the tally of their answers, the verdict that nothing
of a made-up or foreign name was stored, and the table."""

from __future__ import annotations

import json

from bench.push_attackers import (
    BAD_TOKEN, GARBAGE, MADE_UP, OWN_BIG, OWN_FLOOD, VALID, VICTIM, body, by_kind, forged, limit_mib, made_up_names,
    plan, table, verdict,
)
from scalingrun_api.status_push import HEARTBEAT, PROGRESS, push_path

TOKEN = "header.payload.signature"


def test_made_up_names_are_distinct_valid_names_and_the_same_for_a_seed():
    names = made_up_names(500)
    assert len(set(names)) == 500 and names == made_up_names(500) and names != made_up_names(500, seed=1)
    assert all(len(n) <= 63 and n.replace("-", "").isalnum() and n == n.lower() for n in names)


def test_the_plan_sends_garbage_at_the_victims_and_the_valid_token_at_made_up_names_the_victim_and_its_own_run():
    kinds = plan("ns", "own", TOKEN, ["victim", "other"], "victim", "a.b.cd", rate=10, names=300)
    garbage, = kinds[GARBAGE]
    assert garbage.token is None and garbage.spoiled == "a.b.dc" != "a.b.cd"
    assert set(garbage.paths) == {push_path("ns", "victim", PROGRESS), push_path("ns", "other", PROGRESS)}
    valid = {k.label: k for k in kinds[VALID]}
    assert set(valid) == {MADE_UP, VICTIM, OWN_FLOOD, OWN_BIG} and {k.token for k in valid.values()} == {TOKEN}
    assert len(set(valid[MADE_UP].paths)) == 300 and not set(valid[MADE_UP].paths) & set(garbage.paths)
    assert set(valid[VICTIM].paths) == {push_path("ns", "victim", PROGRESS), push_path("ns", "victim", HEARTBEAT)}
    assert valid[OWN_FLOOD].paths == valid[OWN_BIG].paths == (push_path("ns", "own", PROGRESS),)


def test_the_forged_body_carries_the_forged_epoch_and_the_big_one_its_size():
    assert json.loads(body("forged", 9999, 10000))["epoch"] == 9999
    assert json.loads(body("progress", 9999, 10000))["epoch"] == 1
    assert json.loads(body("heartbeat", 9999, 10000))["epoch"] == 9999
    assert len(body("big", 1, 1)) == 10 * 1024 * 1024
    assert forged(TOKEN) == "header.payload.erutangis"


def test_answers_are_tallied_by_kind_whose_label_holds_spaces():
    found = by_kind({f"{MADE_UP} 404": 7, f"{MADE_UP} 429": 2, f"{VICTIM} 403": 3, f"{BAD_TOKEN} ClientOSError": 1})
    assert found == {MADE_UP: {"404": 7, "429": 2}, VICTIM: {"403": 3}, BAD_TOKEN: {"ClientOSError": 1}}


ATTACKERS = {GARBAGE: {f"{BAD_TOKEN} 401": 40, f"{BAD_TOKEN} 429": 60},
             VALID: {f"{MADE_UP} 404": 100, f"{VICTIM} 403": 50, f"{OWN_FLOOD} 202": 5, f"{OWN_FLOOD} 429": 95,
                     f"{OWN_BIG} 413": 9}}


def test_the_verdict_holds_when_every_accepted_push_is_a_healthy_one_or_the_attackers_own_run():
    outcome = verdict(ATTACKERS, healthy_accepted=120, operator_accepted=125.0, victim_epoch=12, forged_epoch=9999)
    assert outcome.held and (outcome.foreign_accepted, outcome.unaccounted) == (0, 0)


def test_the_verdict_fails_on_a_foreign_push_accepted_an_unaccounted_one_or_the_forged_epoch_in_status():
    leaked = {**ATTACKERS, VALID: {**ATTACKERS[VALID], f"{MADE_UP} 202": 1}}
    assert verdict(leaked, 120, 126.0, 12, 9999).foreign_accepted == 1
    assert not verdict(leaked, 120, 126.0, 12, 9999).held
    assert verdict(ATTACKERS, 120, 127.0, 12, 9999).unaccounted == 2
    assert verdict(ATTACKERS, 120, 125.0, 9999, 9999).victim_saw_forged
    assert not verdict(ATTACKERS, 120, 125.0, 9999, 9999).held


def test_the_limit_is_read_from_the_charts_quantity():
    assert limit_mib({"resources": {"limits": {"memory": "512Mi"}}}) == 512
    assert limit_mib({"resources": {"limits": {"memory": "1Gi"}}}) == 1024


def test_the_table_gives_the_ratios_every_kinds_answers_and_the_verdict():
    without = {"post_p50_s": 0.02, "post_p95_s": 0.05, "lag_p50_s": 0.1, "lag_p95_s": 0.4, "missed": 0, "reports": 60}
    beside = {"post_p50_s": 0.04, "post_p95_s": 0.2, "lag_p50_s": 0.2, "lag_p95_s": 0.6, "missed": 0, "reports": 60}
    outcome = verdict(ATTACKERS, 120, 125.0, 12, 9999)
    lines = table(without, beside, ATTACKERS, 10.0, outcome, 256.0, 512.0)
    assert "| push answered (POST round trip), p95 | 0.05 s | 0.20 s | 4.00 |" in lines
    assert "| report -> status epoch, p95 | 0.40 s | 0.60 s | 1.50 |" in lines
    assert f"| {VALID}: {MADE_UP} | 100 | 10.0 | 404 x 100 |" in lines
    assert f"| {GARBAGE}: {BAD_TOKEN} | 100 | 10.0 | 401 x 40, 429 x 60 |" in lines
    assert "(50%)" in lines[-1] and "accepted: 0;" in lines[-1] and "forged epoch: never" in lines[-1]
