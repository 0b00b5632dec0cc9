"""A team's own PyTorch Lightning script, run by spec.training.command (framework pytorch-lightning) under mpirun:

    command: [python, -m, teamtrain.lightning_ddp]

It takes the SDK's ready-made pieces: sdk.torch_batches() (this rank's Parquet shard, Petastorm's rules) and
sdk.LightningCallback() (report_epoch for every epoch) and sdk.lightning_mpi_environment() (ranks from MPI, rank 0's
address reachable from the other pods).
"""

import os

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from scalingrun_trainer import sdk


class Classifier(pl.LightningModule):
    def __init__(self, num_classes, learning_rate):
        super().__init__()
        self.learning_rate = learning_rate
        layers, channels = [], 3
        for width in (16, 32, 64):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))

    def step(self, batch, prefix):
        pixels, labels = batch
        logits = self.net(pixels.permute(0, 3, 1, 2).float() / 255)  # uint8 NHWC from the reader
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(1) == labels).float().mean()
        self.log_dict({f"{prefix}loss": loss, f"{prefix}accuracy": accuracy}, on_step=False, on_epoch=True,
                      sync_dist=True)
        return loss

    def training_step(self, batch, index):
        return self.step(batch, "")

    def validation_step(self, batch, index):
        self.step(batch, "val_")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


def main():
    ctx = sdk.context()
    pl.seed_everything(ctx.seed, verbose=False)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ctx.local_size))
    trainer = pl.Trainer(accelerator="cpu", devices=ctx.local_size, num_nodes=ctx.size // ctx.local_size,
                         # No buffer (BatchNorm statistics) sync in forward: a collective per step, and the ranks'
                         # validation shards differ in length.
                         strategy=pl.strategies.DDPStrategy(cluster_environment=sdk.lightning_mpi_environment(),
                                                            process_group_backend="gloo", forward_sync_buffers=False),
                         max_epochs=ctx.max_epochs, use_distributed_sampler=False, num_sanity_val_steps=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[sdk.LightningCallback()])
    module = Classifier(ctx.num_classes, ctx.learning_rate)
    trainer.fit(module, sdk.torch_batches("train"), sdk.torch_batches("validation"))
    sdk.finish()


if __name__ == "__main__":
    main()
