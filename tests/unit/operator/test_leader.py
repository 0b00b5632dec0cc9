"""Leader-election settings: the Lease is the default, --standalone and --peering turn it off, and
timings that would let two leaders overlap are refused with the variable's name."""

from __future__ import annotations

import pytest

from scalingrun_operator import config, main
from scalingrun_operator.cluster.leader import LeaseSettings


def settings(*argv: str, environ: dict | None = None) -> config.Config:
    return main.settings_from_args(main.build_parser().parse_args(list(argv)), config.load(environ or {}))


def test_the_lease_is_the_default_and_standalone_or_peering_turn_it_off():
    assert (settings().lease_name, settings().peering) == ("scalingrun-operator", "")
    assert settings("--lease", "mine").lease_name == "mine"
    assert (settings("--standalone").lease_name, settings("--standalone").peering) == ("", "")
    assert (settings("--peering", "dev").lease_name, settings("--peering", "dev").peering) == ("", "dev")
    assert settings(environ={"SCALINGRUN_LEASE_NAME": "ha"}).lease_name == "ha"
    with pytest.raises(SystemExit):
        main.build_parser().parse_args(["--lease", "x", "--standalone"])


@pytest.mark.parametrize("environ", [
    {"SCALINGRUN_LEASE_RENEW_DEADLINE_SECONDS": "20"},  # the leader would act on after the Lease expired
    {"SCALINGRUN_LEASE_RENEW_SECONDS": "12"},
    {"SCALINGRUN_LEASE_RENEW_SECONDS": "0"},
])
def test_lease_timings_that_let_two_leaders_overlap_are_refused(environ):
    with pytest.raises(config.ConfigError, match="SCALINGRUN_LEASE_RENEW_DEADLINE_SECONDS"):
        config.load(environ)
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseSettings("l", "ns", "me", duration=15, renew_every=5, renew_deadline=20)


def test_standalone_needs_no_valid_lease_timings():
    assert config.load({"SCALINGRUN_LEASE_NAME": "", "SCALINGRUN_LEASE_RENEW_SECONDS": "30"}).lease_name == ""
