"""What each lossy option does to the ranks' parameters, step by step, on real gloo ranks.

A compressor that silently skipped communication, or an averager that never averaged, fails here:
every rank draws different batches, so without communication their parameters part at once.
"""
import pytest

from autosync.executor.launch import RankPool
from autosync.strategy import Strategy

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

BSP_COMPRESSORS = {
    "fp16": {"compressor": "fp16"},
    "bf16": {"compressor": "bf16"},
    "powersgd": {"compressor": {"name": "powersgd", "rank": 2}},
    "topk": {"compressor": {"name": "topk", "ratio": 0.01}},
}


def _rank_gaps(ctx, strategy: dict, steps: int, communicate: bool):
    """Train mlp ``steps`` steps; after each, the largest parameter gap between any rank and rank 0."""
    import torch
    import torch.distributed as dist

    from autosync import workloads
    from autosync.executor.apply import apply, release

    model, make_batch = workloads.build("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp, opt = apply(model, opt, Strategy.from_dict(strategy), init_sync=False)
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    gaps = []
    try:
        for _ in range(steps):
            batch = make_batch(16, gen)
            if communicate:
                workloads.loss_of(ddp(**batch)).backward()
            else:
                with ddp.no_sync():
                    workloads.loss_of(ddp(**batch)).backward()
            opt.step()
            opt.zero_grad()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            every = [torch.empty_like(flat) for _ in range(ctx.world_size)]
            dist.all_gather(every, flat)
            gaps.append(max(float((e - every[0]).abs().max()) for e in every))
    finally:
        release(ddp)
    return gaps, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.parametrize("name", list(BSP_COMPRESSORS))
def test_every_bsp_compressor_leaves_ranks_identical_and_really_communicates(name):
    strategy = Strategy.from_dict({"groups": [BSP_COMPRESSORS[name]]}).canonical()
    with RankPool(2, ranks_per_host=1) as pool:
        (gaps, synced), _ = pool.run(_rank_gaps, strategy, 6, True)
        (alone_gaps, alone), _ = pool.run(_rank_gaps, strategy, 6, False)
    assert max(gaps) == 0.0, f"{name}: ranks differ after a synchronizing step: {gaps}"
    assert min(alone_gaps) > 0, "without communication the ranks must part (the test would prove nothing)"
    assert abs(synced - alone).max() > 1e-4, f"{name}: the same parameters as with no communication at all"


def test_local_sgd_ranks_are_identical_right_after_averaging_and_differ_between():
    strategy = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 4, "warmup_steps": 2}}).canonical()
    with RankPool(2, ranks_per_host=1) as pool:
        (gaps, _), _ = pool.run(_rank_gaps, strategy, 11, True)
    # torch's PeriodicModelAverager averages after optimizer step s (0-based) when s >= warmup and
    # (s - warmup) % period == 0; before the warm-up ends every step all-reduces gradients.
    averaged = [s < 2 or (s - 2) % 4 == 0 for s in range(11)]
    for s, (gap, avg) in enumerate(zip(gaps, averaged)):
        if avg:
            assert gap < 1e-6, f"step {s}: ranks differ right after averaging ({gap})"
        else:
            assert gap > 1e-6, f"step {s}: ranks identical between averaging steps: the averager is all there is"
