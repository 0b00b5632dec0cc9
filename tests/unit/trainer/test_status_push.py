"""The trainer's status push is a silent no-op without what the operator mounts (local runs, older operators)."""

from __future__ import annotations

from scalingrun_trainer.core import status_push


def _pusher(monkeypatch, directory, path="/v1/namespaces/ns/scalingruns/run"):
    monkeypatch.setenv(status_push.STATUS_DIR_VARIABLE, str(directory))
    if path is None:
        monkeypatch.delenv(status_push.STATUS_PATH_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(status_push.STATUS_PATH_VARIABLE, path)
    status_push.status_pusher.cache_clear()
    try:
        return status_push.status_pusher()
    finally:
        status_push.status_pusher.cache_clear()


def test_nothing_is_pushed_without_the_mounted_files_or_the_path(tmp_path, monkeypatch):
    assert _pusher(monkeypatch, tmp_path / "absent") is None
    (tmp_path / "url").write_text("https://operator:8443")
    assert _pusher(monkeypatch, tmp_path) is None  # no token, no CA (an operator without the status server)
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("ca")
    assert _pusher(monkeypatch, tmp_path, path=None) is None  # an older operator names no path
    assert _pusher(monkeypatch, tmp_path) is not None


def test_a_pod_made_in_pull_mode_starts_pushing_once_the_files_appear(tmp_path, monkeypatch):
    """A `helm upgrade` to the push path with the run in flight: the kubelet fills in the optional ConfigMap's
    files later. They are looked for again, though not at every step."""
    monkeypatch.setenv(status_push.STATUS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv(status_push.STATUS_PATH_VARIABLE, "/v1/namespaces/ns/scalingruns/run")
    (tmp_path / "token").write_text("t")  # the projected token is there from the start, the ConfigMap's files not
    now = [1000.0]
    pusher = status_push.PusherOnceFound(clock=lambda: now[0])
    assert pusher() is None
    (tmp_path / "url").write_text("https://operator:8443")
    (tmp_path / "ca.crt").write_text("ca")
    now[0] += status_push.LOOK_AGAIN_SECONDS - 1
    assert pusher() is None  # not looked for again yet
    now[0] += 1
    found = pusher()
    assert found is not None and found.base_url == "https://operator:8443"
    (tmp_path / "url").unlink()
    now[0] += 10 * status_push.LOOK_AGAIN_SECONDS
    assert pusher() is found  # kept once found
