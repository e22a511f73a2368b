"""PyTorch Lightning training by a strategy file from `autosync tune`.

    python examples/train_lightning.py --strategy strategy.yaml --devices 2 [--workload resnet-tiny]
    python examples/train_lightning.py --strategy auto --devices 2 --steps 200   # tune while training

Where there are GPUs Lightning trains on them with NCCL (``--accelerator auto``, the default: one process per
device), else on CPU processes with gloo; ``--accelerator cpu`` forces the CPU.

The one autosync line is the Trainer's ``strategy=AutosyncDDPStrategy(...)``: Lightning wraps the model in
DDP with the file's bucket options, autosync's comm hook runs every plan and compressor of the file, and
local SGD's averaging runs in Lightning's post-step averaging. ``--strategy ddp`` trains with Lightning's
plain ``DDPStrategy`` instead (the reference a lossless file must match); ``--strategy auto`` tunes in windows
of this training's steps and writes autosync-strategy.yaml (``--auto-window``, ``--auto-budget``: its options).
Prints how many buckets autosync's hook synchronized.
"""
import argparse

import pytorch_lightning as pl
import torch

from autosync import workloads


class Workload(pl.LightningModule):
    """A built-in autosync workload as a LightningModule (loss = the model's output, SGD with momentum)."""

    def __init__(self, name: str, lr: float):
        super().__init__()
        torch.manual_seed(0)
        self.net, _ = workloads.build(name)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        return workloads.loss_of(self.net(**batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Batches(torch.utils.data.Dataset):
    """``n`` samples drawn once from the workload's batch maker (the same on every rank; Lightning's
    DistributedSampler gives each rank its share)."""

    def __init__(self, name: str, n: int):
        _, make_batch = workloads.build(name)
        self.data = make_batch(n, torch.Generator().manual_seed(1234))

    def __len__(self):
        return len(next(iter(self.data.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.data.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True, help="strategy file (YAML or JSON), or 'ddp' for Lightning's own")
    ap.add_argument("--workload", default="resnet-tiny", help="built-in workload to train")
    ap.add_argument("--accelerator", default="auto",
                    help="Lightning's accelerator: auto (GPUs with NCCL where there are any, else CPU with gloo), "
                         "gpu or cpu")
    ap.add_argument("--devices", type=int, default=2, help="processes on this machine (one per device)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--ranks-per-host", type=int, default=None,
                    help="ranks per host for host-aware plans and local SGD (default: the processes on this machine)")
    ap.add_argument("--auto-window", type=int, default=8, help="with --strategy auto: timed steps per window")
    ap.add_argument("--auto-budget", type=float, default=0.05,
                    help="with --strategy auto: share of the training time candidates may lose (default 0.05)")
    ap.add_argument("--save", help="write the trained parameters here (rank 0; torch.save of the state dict)")
    args = ap.parse_args()

    if args.strategy == "ddp":
        strategy = pl.strategies.DDPStrategy()     # Lightning picks the backend: NCCL on GPUs, gloo on CPUs
    else:
        from autosync.integrations.lightning import AutosyncDDPStrategy

        auto = {"window": args.auto_window, "budget": args.auto_budget} if args.strategy == "auto" else None
        strategy = AutosyncDDPStrategy(args.strategy, ranks_per_host=args.ranks_per_host, module="net",
                                       auto_options=auto)  # the one line
    batch = workloads.default_batch_size(args.workload)
    loader = torch.utils.data.DataLoader(Batches(args.workload, batch * args.devices * args.steps), batch_size=batch)
    trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=strategy, max_steps=args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    module = Workload(args.workload, args.lr)
    trainer.fit(module, loader)
    state = getattr(strategy, "autosync_state", None)
    if trainer.global_rank == 0:
        if args.save:
            torch.save(module.net.state_dict(), args.save)
        print(f"trained {trainer.global_step} steps on {trainer.world_size} ranks with {args.strategy}; "
              f"autosync hook calls: {state.hook_calls if state is not None else 0}")


if __name__ == "__main__":
    main()
