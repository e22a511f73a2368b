"""Hugging Face Transformers ``Trainer`` training by a strategy file from `autosync tune`.

    torchrun --nproc-per-node 2 examples/train_hf_trainer.py --strategy strategy.yaml [--workload gpt2-tiny]
    torchrun --nproc-per-node 2 examples/train_hf_trainer.py --strategy auto --steps 200   # tune while training

The Trainer wraps the model in DDP itself; ``AutosyncCallback`` registers autosync's comm hook on that DDP
when training begins, and ``training_arguments(strategy)`` passes the file's bucket options to
``TrainingArguments``. ``--strategy ddp`` trains without autosync (the reference a lossless file must
match). ``--save`` writes the trained parameters.
"""
import argparse
import os
import tempfile

import torch
from transformers import Trainer, TrainingArguments

from autosync import workloads


class WithLoss(torch.nn.Module):
    """A built-in workload whose forward returns ``{"loss": ...}``, as the Trainer expects."""

    def __init__(self, name: str):
        super().__init__()
        torch.manual_seed(0)
        self.net, _ = workloads.build(name)

    def forward(self, num_items_in_batch=None, **batch):   # the Trainer's own argument: not the model's
        return {"loss": workloads.loss_of(self.net(**batch))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True, help="strategy file (YAML or JSON), or 'ddp' for the Trainer's own")
    ap.add_argument("--workload", default="gpt2-tiny", help="built-in workload to train")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--ranks-per-host", type=int, default=None,
                    help="ranks per host for host-aware plans and local SGD (default: the processes on this machine)")
    ap.add_argument("--auto-window", type=int, default=8, help="with --strategy auto: timed steps per window")
    ap.add_argument("--auto-budget", type=float, default=0.05,
                    help="with --strategy auto: share of the training time candidates may lose (default 0.05)")
    ap.add_argument("--save", help="write the trained parameters here (rank 0; torch.save of the state dict)")
    args = ap.parse_args()

    batch = workloads.default_batch_size(args.workload)
    world = int(os.environ.get("WORLD_SIZE", 1))
    _, make_batch = workloads.build(args.workload)
    data = make_batch(batch * world * args.steps, torch.Generator().manual_seed(1234))
    samples = [{k: v[i] for k, v in data.items()} for i in range(batch * world * args.steps)]
    with tempfile.TemporaryDirectory(prefix="autosync-trainer-") as out_dir:   # the Trainer's output_dir: gone at exit
        train(args, samples, batch, world, out_dir)


def train(args, samples, batch, world, out_dir) -> None:
    from autosync.integrations.transformers import AutosyncCallback, training_arguments

    extra = training_arguments(args.strategy) if args.strategy != "ddp" else {}
    targs = TrainingArguments(out_dir, per_device_train_batch_size=batch,
                              max_steps=args.steps, learning_rate=args.lr, optim="sgd", lr_scheduler_type="constant",
                              warmup_steps=0, weight_decay=0.0, logging_strategy="no", save_strategy="no",
                              report_to=[], use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                              remove_unused_columns=False, ddp_find_unused_parameters=False,
                              ddp_backend="gloo" if not torch.cuda.is_available() else None, seed=0, **extra)
    model = WithLoss(args.workload)
    trainer = Trainer(model=model, args=targs, train_dataset=samples)
    callback = None
    if args.strategy != "ddp":
        auto = {"window": args.auto_window, "budget": args.auto_budget} if args.strategy == "auto" else None
        callback = AutosyncCallback(trainer, args.strategy, args.ranks_per_host, module="net",
                                    auto_options=auto)   # the one autosync line
        trainer.add_callback(callback)
    trainer.train()
    if trainer.is_world_process_zero():
        if args.save:
            torch.save(model.net.state_dict(), args.save)
        print(f"trained {trainer.state.global_step} steps on {world} ranks with {args.strategy}; "
              f"autosync hook calls: {callback.state.hook_calls if callback else 0}")


if __name__ == "__main__":
    main()
