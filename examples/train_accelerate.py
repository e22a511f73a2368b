"""Hugging Face Accelerate training by a strategy file from `autosync tune`.

    torchrun --nproc-per-node 2 examples/train_accelerate.py --strategy strategy.yaml [--workload resnet-tiny]

Accelerate wraps the model in DDP itself, so autosync registers its comm hook on the wrapped model
(``autosync.register``). DDP's bucket options cannot change after wrapping: they go in through Accelerate's
``DistributedDataParallelKwargs`` (``autosync.ddp_kwargs(strategy)`` gives them). ``--strategy ddp`` trains
without autosync (the reference a lossless file must match). ``--save`` writes the trained parameters.
"""
import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs

import autosync
from autosync import workloads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True, help="strategy file (YAML or JSON), 'auto' (tune while training), or 'ddp' for plain DDP")
    ap.add_argument("--workload", default="resnet-tiny", help="built-in workload to train")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--ranks-per-host", type=int, default=None,
                    help="ranks per host for host-aware plans and local SGD (default: the processes on this machine)")
    ap.add_argument("--save", help="write the trained parameters here (main process; torch.save of the state dict)")
    args = ap.parse_args()

    strategy = None if args.strategy == "ddp" else "auto" if args.strategy == "auto" else \
        autosync.load_strategy(args.strategy)
    handlers = [DistributedDataParallelKwargs(**autosync.ddp_kwargs(strategy))] if strategy else []
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=handlers)
    torch.manual_seed(0)
    model, make_batch = workloads.build(args.workload)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    if strategy is not None:
        optimizer = autosync.register(model, strategy, optimizer, ranks_per_host=args.ranks_per_host)   # autosync

    gen = torch.Generator().manual_seed(1000 + accelerator.process_index)
    batch_size = workloads.default_batch_size(args.workload)
    for step in range(args.steps):
        batch = {k: v.to(accelerator.device) for k, v in make_batch(batch_size, gen).items()}
        accelerator.backward(workloads.loss_of(model(**batch)))
        optimizer.step()
        optimizer.zero_grad()
    state = getattr(model, "autosync_state", None)
    calls = state.hook_calls if state is not None else 0
    autosync.release(model)
    if accelerator.is_main_process:
        if args.save:
            torch.save(accelerator.unwrap_model(model).state_dict(), args.save)
        print(f"trained {args.steps} steps on {accelerator.num_processes} ranks with {args.strategy}; "
              f"autosync hook calls: {calls}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
