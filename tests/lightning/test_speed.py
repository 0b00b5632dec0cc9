"""The Lightning trainer's speed changes keep its results: the model's channels-last base and the frozen base
without autograd compute bit for bit what the previous layout did, a frozen base in inference mode (BatchNorms
folded into the convolutions) what it did up to float rounding, and the reader's batches are whole tensors
holding every stored row once per validation pass (in the Lightning venv)."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from scalingrun_trainer.preprocess.shards import Params, process_shard
from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

pytestmark = pytest.mark.lightning

EXACT = """
import copy, json, torch
from torch.nn import functional as F
from scalingrun_trainer.frameworks.lightning.efficientnet_lite import MEAN, STDDEV, load_base_weights
from scalingrun_trainer.frameworks.lightning.model import TransferNet

torch.manual_seed(0)
net = TransferNet(10, 0.2)
load_base_weights(net.base, "imagenet")
# The previous model: weights in PyTorch's default layout, the base always under autograd.
previous = copy.deepcopy(net).to(memory_format=torch.contiguous_format)
assert not previous.base._conv_stem.weight.is_contiguous(memory_format=torch.channels_last)
pixels, labels = torch.randint(0, 256, (8, 64, 64, 3), dtype=torch.uint8), torch.randint(0, 10, (8,))
def largest_difference(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()

results = {}
# "train, base eval": the trainer's own frozen step (training_step keeps a frozen base in inference mode).
for mode in ("train", "eval", "train, base eval"):
    for frozen in (True, False):
        new, old = copy.deepcopy(net), copy.deepcopy(previous)
        for model in (new, old):
            model.train(mode.startswith("train"))
            if mode.endswith("base eval"):
                model.base.eval()
            model.base.requires_grad_(not frozen)
        new.frozen_base = frozen
        torch.manual_seed(1)
        new_logits = new.logits(pixels)
        torch.manual_seed(1)  # the same dropout mask
        old_logits = old.head(old.dropout(old.base((pixels.permute(0, 3, 1, 2).float() - MEAN) / STDDEV)))
        F.cross_entropy(new_logits, labels).backward()
        F.cross_entropy(old_logits, labels).backward()
        grads = [(a.grad, b.grad) for a, b in zip(new.parameters(), old.parameters()) if b.grad is not None]
        results[f"{mode} {'frozen' if frozen else 'trainable'}"] = {
            "logits": torch.equal(new_logits, old_logits), "grads": len(grads),
            "grads_equal": all(torch.equal(a, b) for a, b in grads),
            "logits_difference": largest_difference(new_logits, old_logits),
            "grads_difference": max(largest_difference(a, b) for a, b in grads),
            "base_graph": new_logits.grad_fn is not None and any(
                p.grad is not None for p in new.base.parameters())}
print(json.dumps(results))
"""

READER = """
import collections, hashlib, json, sys
import torch
from scalingrun_trainer.core.dataset import open_dataset
from scalingrun_trainer.frameworks.lightning.data import TrainBatches, ValidationBatches

dataset = open_dataset(sys.argv[1])
train = TrainBatches(dataset, rank=0, size=1, batch_size=8, steps=5, seed=0, shuffle_rows=16)
try:
    epochs = [[(x, y) for x, y in train] for _ in range(2)]
finally:
    train.close()
validation = ValidationBatches(dataset, rank=0, size=1, batch_size=8, seed=0)
passes = [[(x, y) for x, y in validation] for _ in range(2)]
def rows(batches):
    return sorted(f"{hashlib.sha1(x.numpy().tobytes()).hexdigest()} {int(y)}" for b in batches for x, y in zip(*b))
print(json.dumps({
    "train_batches": [len(e) for e in epochs],
    "train_types": sorted({f"{x.dtype} {tuple(x.shape)} {y.dtype}" for e in epochs for x, y in e}),
    "train_classes": [len(set(y.tolist())) for e in epochs for _, y in e],
    "validation": [rows(p) for p in passes],
    "validation_sizes": [len(y) for _, y in passes[0]],
}))
"""


def run(python: str, script: str, *args: str) -> dict:
    result = subprocess.run([python, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_channels_last_and_frozen_base_without_autograd_are_exact_and_folded_batchnorm_close(lightning_python):
    results = run(lightning_python, EXACT)
    assert set(results) == {f"{mode} {kind}" for mode in ("train", "eval", "train, base eval")
                            for kind in ("frozen", "trainable")}
    for case, result in results.items():
        if case in ("eval frozen", "train, base eval frozen"):  # BatchNorm folded: float rounding only
            assert not result["logits"] and result["logits_difference"] < 1e-4, (case, result)
            assert result["grads_difference"] < 1e-4, (case, result)
        else:
            assert result["logits"] and result["grads_equal"], case
        # Frozen: only the head has gradients and no graph reaches the base; trainable: the base's too.
        assert (result["grads"] == 2) is case.endswith("frozen"), case  # the head's weight and bias only
        assert result["base_graph"] is case.endswith("trainable"), case


def test_reader_batches_are_whole_tensors_and_validation_is_every_row(lightning_python, tmp_path):
    import pyarrow.parquet as pq

    for relative, data in fashion_mnist_jpegs(6):
        (tmp_path / "jpeg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "jpeg" / relative).write_bytes(data)
    output = tmp_path / "parquet"
    process_shard(Params(str(tmp_path / "jpeg"), str(output), image_size=8, validation_fraction=0.3,
                         max_readers=2), 0, 1, workers=1)
    result = run(lightning_python, READER, str(output))
    assert result["train_batches"] == [5, 5]
    assert result["train_types"] == ["torch.uint8 (8, 8, 8, 3) torch.int64"]
    assert sorted(result["train_classes"])[len(result["train_classes"]) // 2] >= 3  # mixed across row groups
    stored = []
    for name in json.loads((output / "_manifest.json").read_text())["files"]["validation"]:
        table = pq.read_table(output / name)
        stored += [f"{hashlib.sha1(i).hexdigest()} {l}"
                   for i, l in zip(table.column("image").to_pylist(), table.column("label").to_pylist())]
    assert result["validation"] == [sorted(stored)] * 2
    assert result["validation_sizes"][:-1] == [8] * (len(result["validation_sizes"]) - 1)
