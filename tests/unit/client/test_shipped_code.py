"""A directory shipped with a function (scalingrun_api.shipped_code): the same files pack to the same bytes, so the
payload's digest changes only with the code; caches, compiled files and symlinks stay out (a symlink is refused by
name); the caps hold; an archive with a path outside its folder is refused; a rank unpacks an archive once per
machine (scalingrun_trainer.sdk.packages.unpack_code)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from scalingrun_api import shipped_code
from scalingrun_api.shipped import digest, open_payload, pack
from scalingrun_api.shipped_code import ShippedCodeError, pack_directory, unpack_directory
from scalingrun_trainer.sdk import packages


def team_code(root):
    (root / "teamnets" / "__pycache__").mkdir(parents=True)
    (root / "teamnets" / "__init__.py").write_text("WIDTH = 16\n")
    (root / "teamnets" / "layers.py").write_text("def width():\n    return 16\n")
    (root / "teamnets" / "__pycache__" / "layers.cpython-311.pyc").write_bytes(b"\0compiled")
    (root / "teamnets" / "stale.pyc").write_bytes(b"\0compiled")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def files_under(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def run_me():
    return 1


def test_the_same_files_pack_to_the_same_bytes_and_come_back_without_caches(tmp_path):
    code = team_code(tmp_path / "code")
    first = pack_directory(code)
    os.utime(code / "teamnets" / "layers.py", (1, 1))  # a touch changes no byte of the archive
    assert pack_directory(code) == first
    unpack_directory(first, tmp_path / "out")
    assert files_under(tmp_path / "out") == {"teamnets/__init__.py": b"WIDTH = 16\n",
                                              "teamnets/layers.py": b"def width():\n    return 16\n"}


def test_the_payloads_digest_covers_the_code(tmp_path):
    code = team_code(tmp_path / "code")
    before = pack(run_me, {}, None, pack_directory(code))
    (code / "teamnets" / "layers.py").write_text("def width():\n    return 32\n")
    after = pack(run_me, {}, None, pack_directory(code))
    assert digest(before) != digest(after)
    assert open_payload(after, digest(after))["code"] == pack_directory(code)


def test_a_symlink_is_refused_naming_it(tmp_path):
    code = team_code(tmp_path / "code")
    (code / "teamnets" / "data.csv").symlink_to("/etc/hostname")
    with pytest.raises(ShippedCodeError, match=r"teamnets/data\.csv is a symlink: ship the file itself"):
        pack_directory(code)


def test_a_tree_over_the_caps_is_refused_before_anything_is_packed(tmp_path, monkeypatch):
    code = team_code(tmp_path / "code")
    monkeypatch.setattr(shipped_code, "MAX_CODE_FILES", 1)
    with pytest.raises(ShippedCodeError, match=r"2 files, over the cap of 1"):
        pack_directory(code)
    monkeypatch.setattr(shipped_code, "MAX_CODE_FILES", 10)
    monkeypatch.setattr(shipped_code, "MAX_CODE_BYTES", 20)
    with pytest.raises(ShippedCodeError, match=r"38 bytes, over the cap of 20"):
        pack_directory(code)
    with pytest.raises(ShippedCodeError, match=r"not a directory"):
        pack_directory(code / "teamnets" / "layers.py")


def archive_of(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = 1 if kind == tarfile.REGTYPE else 0
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info


@pytest.mark.parametrize("bad", [member("../outside.py"), member("/abs/olute.py"), member("a/../../up.py"),
                                 member("link.py", tarfile.SYMTYPE), member("dev", tarfile.CHRTYPE)],
                         ids=["parent", "absolute", "nested-parent", "symlink", "device"])
def test_an_archive_member_outside_its_folder_or_not_a_file_is_refused(tmp_path, bad):
    with pytest.raises(ShippedCodeError, match=rf"member {bad.name!r} refused"):
        unpack_directory(archive_of(member("ok.py"), bad), tmp_path / "out")
    assert not (tmp_path / "outside.py").exists() and not (tmp_path / "up.py").exists()


def test_a_rank_unpacks_an_archive_once_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv(packages.CACHE_ENV, str(tmp_path / "cache"))
    archive = pack_directory(team_code(tmp_path / "code"))
    folder, fresh = packages.unpack_code(archive)
    assert fresh and (folder / "teamnets" / "layers.py").read_text() == "def width():\n    return 16\n"
    inode = (folder / "teamnets" / "layers.py").stat().st_ino
    assert packages.unpack_code(archive) == (folder, False)
    assert (folder / "teamnets" / "layers.py").stat().st_ino == inode
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [folder.name]  # no partial left
