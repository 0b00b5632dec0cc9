"""The local SeaweedFS (the quick start's and the tests' S3 server) takes as many buckets as a run needs on any
machine: left to itself, `weed mini` sizes its volume count from the free disk (free space / volume size) and
every bucket takes a volume, so a machine short of disk refused the tenth bucket's writes."""

from __future__ import annotations

import json
import urllib.request

import pytest

from scalingrun_operator.local.s3server import MAX_VOLUMES

pytestmark = pytest.mark.s3

BUCKETS = 12


def test_the_volume_count_is_ours_not_the_free_disk(s3_server):
    master = s3_server.s3_port - 3
    with urllib.request.urlopen(f"http://127.0.0.1:{master}/dir/status", timeout=10) as response:
        topology = json.load(response)["Topology"]
    assert topology["Max"] == MAX_VOLUMES, topology


def test_a_dozen_buckets_each_take_writes(s3_server):
    fs = s3_server.filesystem()
    for index in range(BUCKETS):
        bucket = f"many-buckets-{index}"
        s3_server.create_bucket(bucket)
        with fs.open_output_stream(f"{bucket}/object.bin") as stream:
            stream.write(bytes([index]) * 4096)
    for index in range(BUCKETS):
        with fs.open_input_stream(f"many-buckets-{index}/object.bin") as stream:
            assert stream.read() == bytes([index]) * 4096
