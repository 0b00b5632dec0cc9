"""A Secret's value never reaches a condition, an Event or the log: a key that cannot be a header is refused
naming the Secret and key; and a value the signer chokes on anyway is not quoted in what storage says."""

from __future__ import annotations

import logging

import pytest

from scalingrun_operator.pull import storage
from scalingrun_operator.pull.secret_keys import credential

PEM = b"-----BEGIN PRIVATE KEY-----\nTOPSECRETLINE1\nTOPSECRETLINE2\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize("raw,accepted", [
    (b"AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    (b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),  # echo > file
    (PEM, None),
    (b"[default]\naws_access_key_id = TOPSECRET\n", None),  # an INI file
    (b"TOPSECRET\x00", None),
    (b"TOP\tSECRET", None),
    ("TOPSECRÉT".encode(), None),
    (b"\xffTOPSECRET", None),
    (b"  \n", None),
])
def test_a_key_is_one_line_of_printable_ascii_and_a_refusal_names_only_where(raw, accepted):
    where = "Secret ml/s3-creds key 'AWS_SECRET_ACCESS_KEY'"
    if accepted:
        assert credential(raw, where) == accepted
        return
    with pytest.raises(storage.StorageError) as refused:
        credential(raw, where)
    message = str(refused.value)
    assert message.startswith(where) and "TOPSECRET" not in message and "SECRET\x00" not in message
    assert refused.value.__cause__ is None or "TOPSECRET" not in str(refused.value.__cause__)


def test_the_signer_failing_on_a_value_is_not_quoted(caplog):
    """Past the check (keys handed to storage directly): botocore's error quotes the header; storage does not."""
    keys = storage.Credentials("AKIA\nTOPSECRETID", "TOPSECRETKEY\r\nX-Injected: 1")
    # An address nothing answers (TEST-NET-2): each connect fails (at most 0.5 s) and is tried again within the
    # deadline, which must leave the first try room to end on its own: at 0.5 s, a CI run on a busy machine ran out
    # of it before the first connect had failed, and the error said so instead.
    target = storage.StorageTarget("http://198.51.100.1:9", "us-east-1", keys, timeout=0.5, deadline=5)
    with caplog.at_level(logging.DEBUG, logger="scalingrun_operator"):
        with pytest.raises(storage.StorageError) as failed:
            storage.read_json("s3://bucket/progress.json", target)
    assert "TOPSECRET" not in str(failed.value) and "TOPSECRET" not in caplog.text
    assert "not reachable or not allowed" in str(failed.value)
