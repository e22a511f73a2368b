"""A plain DDP training script that trains by a strategy file from `autosync tune`, or tunes while it trains.

    torchrun --nproc-per-node 2 examples/train_with_strategy.py --strategy strategy.yaml --workload resnet-tiny
    torchrun --nproc-per-node 2 examples/train_with_strategy.py --strategy auto --steps 200

Everything here is ordinary PyTorch except one line: ``autosync.apply``. Swap the built-in
workload for your own model, optimizer and data loader.
"""
import argparse
import os

import torch
import torch.distributed as dist

import autosync
from autosync import workloads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True,
                    help="strategy file (YAML or JSON), or auto (tune in windows of this training's steps; the "
                         "pick is written to autosync-strategy.yaml)")
    ap.add_argument("--workload", default="resnet-tiny", help="built-in workload to train")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    # One GPU per rank with NCCL where there are GPUs, else CPU with gloo; torchrun provides RANK, LOCAL_RANK, ...
    device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu"
    if device != "cpu":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device != "cpu" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, make_batch = workloads.build(args.workload)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    model, optimizer = autosync.apply(model, optimizer, args.strategy)   # the one autosync line

    gen = torch.Generator().manual_seed(1000 + rank)
    batch_size = workloads.default_batch_size(args.workload)
    for step in range(args.steps):
        batch = {k: v.to(device) for k, v in make_batch(batch_size, gen).items()}
        loss = workloads.loss_of(model(**batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    autosync.release(model)
    dist.destroy_process_group()
    if rank == 0:
        print(f"trained {args.steps} steps on {os.environ.get('WORLD_SIZE')} ranks with {args.strategy}")


if __name__ == "__main__":
    main()
