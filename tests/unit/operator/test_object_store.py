"""The tools' own storage client (object_store.py) on the local disk: what is absent is None, what is too large is
refused unread, a document that is no JSON object is an error naming it, and listings see one folder's level."""

from __future__ import annotations

import pytest

from scalingrun_operator.object_store import (
    Credentials, StorageError, Store, list_folders, list_names, read_bytes, read_json, secret_key_value, write_bytes,
)

LOCAL = Store(None, "us-east-1", max_bytes=64)


def test_local_reads_writes_and_listings(tmp_path):
    assert read_bytes(str(tmp_path / "missing.json"), LOCAL) is None
    assert read_json(f"file://{tmp_path}/missing.json", LOCAL) is None
    write_bytes(f"file://{tmp_path}/run/progress.json", LOCAL, b'{"epoch": 2}')
    assert read_json(str(tmp_path / "run" / "progress.json"), LOCAL) == {"epoch": 2}
    write_bytes(str(tmp_path / "run" / "attempt-1" / "launcher.log"), LOCAL, b"hello")
    assert list_names(str(tmp_path / "run"), LOCAL) == ["progress.json"]
    assert list_folders(str(tmp_path / "run"), LOCAL) == ["attempt-1"]
    assert list_names(str(tmp_path / "nowhere"), LOCAL) == [] == list_folders(str(tmp_path / "nowhere"), LOCAL)


def test_too_large_and_not_an_object_are_errors_that_name_the_document(tmp_path):
    (tmp_path / "big.json").write_bytes(b"[" + b"1," * 40 + b"1]")
    with pytest.raises(StorageError, match="big.json: it is over 64 bytes"):
        read_bytes(str(tmp_path / "big.json"), LOCAL)
    (tmp_path / "list.json").write_bytes(b"[1, 2]")
    with pytest.raises(StorageError, match="list.json is not a JSON object"):
        read_json(str(tmp_path / "list.json"), LOCAL)


def test_keys_are_one_printable_line_and_never_shown():
    assert secret_key_value(b"AKIAEXAMPLE\n", "Secret ml/s3 key 'id'") == "AKIAEXAMPLE"
    with pytest.raises(ValueError, match="Secret ml/s3 key 'id' holds control") as refused:
        secret_key_value(b"TOP\nSECRET", "Secret ml/s3 key 'id'")
    assert "SECRET" not in str(refused.value).replace("Secret", "")
    assert repr(Credentials("AKIAEXAMPLE", "TOPSECRET")) == "Credentials(***)"
