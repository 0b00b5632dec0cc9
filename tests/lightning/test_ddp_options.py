"""DDP's per-forward buffer sync is off on the installed torch, and the option is named as the torch at hand names it
(torch 2.11 has no `forward_sync_buffers`: the first H100 run of bench/gpu.sh failed on it)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.env import ROOT

pytestmark = pytest.mark.lightning

PROGRAM = r"""
import os, sys, tempfile, warnings
warnings.simplefilter("error")  # a deprecated name would warn (broadcast_buffers on torch 2.13)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from scalingrun_trainer.frameworks.lightning.cluster import no_forward_buffer_sync

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))  # BatchNorm: buffers to sync
ddp = DistributedDataParallel(model, **no_forward_buffer_sync())
assert ddp.modules_buffers, "the model has buffers"
print("syncs buffers in forward:", ddp.will_sync_module_buffers())


def before_2_13(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True):
    pass


def from_2_13(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None):
    pass


print("before 2.13:", no_forward_buffer_sync(before_2_13), "from 2.13:", no_forward_buffer_sync(from_2_13))
"""


def test_ddp_skips_the_buffer_sync_in_forward_under_either_name(lightning_python):
    result = subprocess.run([lightning_python, "-c", PROGRAM], capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": f"{ROOT}/trainer", "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "syncs buffers in forward: False" in result.stdout, result.stdout
    assert ("before 2.13: {'broadcast_buffers': False} from 2.13: {'forward_sync_buffers': False}"
            in result.stdout), result.stdout
