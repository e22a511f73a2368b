"""The math of each compressor, checked against a reference on the same gradients, on two real gloo ranks.

Each test also runs its reference with one thing broken (the wrong rank, no error feedback, no rounding) and
checks that it no longer matches, so the comparison can fail: a compressor that sent zeros, skipped its error
feedback or averaged wrongly is caught.
"""
import numpy as np
import pytest

from autosync.executor.launch import RankPool
from autosync.strategy import Strategy

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
STEPS = 4


def _net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def _flat(params) -> np.ndarray:
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in params]).double().numpy()


def _gradients(ctx, strategy: dict, steps: int, torch_powersgd_rank: int | None = None):
    """Per step: every rank's local gradient (a copy of the model, no communication) and this rank's gradient as
    the strategy's hook left it. The learning rate is 0, so every step sees the same weights and only the
    batches differ. With ``torch_powersgd_rank``, also the gradient torch's own PowerSGD hook gives plain DDP."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from autosync.executor.apply import apply, release

    model = _net()
    local, theirs = copy.deepcopy(model), copy.deepcopy(model)
    ddp, opt = apply(model, torch.optim.SGD(model.parameters(), lr=0.0), Strategy.from_dict(strategy),
                     init_sync=False)
    plain = None
    if torch_powersgd_rank is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        plain = DDP(theirs, gradient_as_bucket_view=True)
        plain.register_comm_hook(powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=torch_powersgd_rank, start_powerSGD_iter=2,
            min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0), powerSGD_hook.powerSGD_hook)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    out = []
    try:
        for _ in range(steps):
            x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
            for net in (ddp, local) + ((plain,) if plain is not None else ()):
                net.zero_grad()
                ((net(x) - y) ** 2).mean().backward()
            mine = torch.tensor(_flat(local.parameters()))
            every = [torch.empty_like(mine) for _ in range(ctx.world_size)]
            dist.all_gather(every, mine)
            out.append({"local": [e.numpy() for e in every], "synced": _flat(model.parameters()),
                        "torch": _flat(theirs.parameters()) if plain is not None else None})
    finally:
        release(ddp)
    return out


def _run(strategy: dict, steps: int = STEPS, torch_powersgd_rank=None):
    with RankPool(2, ranks_per_host=1) as pool:
        per_rank = pool.run(_gradients, Strategy.from_dict(strategy).canonical(), steps, torch_powersgd_rank)
    return per_rank


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_low_precision_is_the_sum_of_the_rounded_shares(name):
    """fp16 / bf16: every rank gets sum over ranks of round(g_r / W), the rounding of the compressor's dtype."""
    import torch

    per_rank = _run({"groups": [{"compressor": name}]})
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    for i, step in enumerate(per_rank[0]):
        shares = [torch.tensor(g, dtype=torch.float32).div(2).to(torch_dtype) for g in step["local"]]
        want = (shares[0] + shares[1]).double().numpy()
        for rank in per_rank:
            assert np.array_equal(rank[i]["synced"], want), f"{name}: not the sum of the rounded shares"
        exact = sum(step["local"]) / 2          # the broken variant: no rounding
        assert not np.array_equal(want, exact), "rounding changed nothing: the comparison could not fail"


def test_topk_sends_the_k_largest_and_keeps_the_rest_as_residual():
    """topk {ratio}: each rank sends the k = ratio * n largest entries (by magnitude) of its gradient plus its
    residual; the result is their sum / W; what was not sent is the next step's residual (error feedback)."""
    ratio = 0.05
    per_rank = _run({"groups": [{"compressor": {"name": "topk", "ratio": ratio}}]})
    n = len(per_rank[0][0]["local"][0])
    k = max(1, int(ratio * n))

    def reference(feedback: bool):
        residual = [np.zeros(n), np.zeros(n)]
        results = []
        for step in per_rank[0]:
            total = np.zeros(n)
            for r, g in enumerate(step["local"]):
                corrected = g + residual[r] if feedback else g
                top = np.argsort(-np.abs(corrected), kind="stable")[:k]
                total[top] += corrected[top]
                residual[r] = corrected.copy()
                residual[r][top] = 0
            results.append(total / 2)
        return results

    want = reference(feedback=True)
    for rank in per_rank:
        for step, expected in zip(rank, want):
            np.testing.assert_allclose(step["synced"], expected, rtol=1e-6, atol=1e-7)
    assert np.count_nonzero(want[0]) <= 2 * k
    # without the residual the reference parts from the compressor after the first step
    unfed = reference(feedback=False)
    assert np.allclose(unfed[0], want[0]) and not np.allclose(unfed[-1], per_rank[0][-1]["synced"], atol=1e-7)


def test_powersgd_equals_torchs_own_hook_on_plain_ddp():
    """powersgd {rank}: the same gradients as torch's powerSGD_hook (error feedback, warm start, two plain
    all-reduce steps first) registered on plain DDP, step after step; with torch at another rank they part."""
    per_rank = _run({"groups": [{"compressor": {"name": "powersgd", "rank": 2}}]}, steps=5, torch_powersgd_rank=2)
    for rank in per_rank:
        for step in rank:
            np.testing.assert_allclose(step["synced"], step["torch"], rtol=1e-5, atol=1e-7)
        exact = sum(rank[-1]["local"]) / 2
        assert not np.allclose(rank[-1]["synced"], exact, atol=1e-6), "compressed steps must not be exact"
        np.testing.assert_allclose(rank[0]["synced"], sum(rank[0]["local"]) / 2, rtol=1e-5, atol=1e-7)
    other = _run({"groups": [{"compressor": {"name": "powersgd", "rank": 2}}]}, steps=5, torch_powersgd_rank=1)
    assert not np.allclose(other[0][-1]["synced"], other[0][-1]["torch"], atol=1e-6), "rank 1 vs 2 could not differ"
