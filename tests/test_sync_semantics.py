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


def _rank_gaps(ctx, strategy: dict, steps: int, communicate: bool, per_rank: bool = False):
    """Train mlp ``steps`` steps; after each, the largest parameter gap between any rank and rank 0 (with
    ``per_rank``, the list of each rank's gap to rank 0)."""
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
            each = [float((e - every[0]).abs().max()) for e in every]
            gaps.append(each if per_rank else max(each))
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


def test_selective_averages_inside_an_island_every_step_and_across_islands_every_period():
    """Islands [[0, 1], [2]] (three hosts of one rank): ranks 0 and 1 draw different batches yet stay identical
    (their gradients are averaged every step); rank 2 parts from them between averagings and meets them at each
    (torch's PeriodicModelAverager, as in local SGD)."""
    strategy = Strategy.from_dict({"sync": {"mode": "selective", "islands": [[0, 1], [2]], "period": 4,
                                            "warmup_steps": 2}}).canonical()
    with RankPool(3, ranks_per_host=1) as pool:
        (gaps, _), _, _ = pool.run(_rank_gaps, strategy, 11, True, True)
    averaged = [s < 2 or (s - 2) % 4 == 0 for s in range(11)]
    for s, ((_, gap1, gap2), avg) in enumerate(zip(gaps, averaged)):
        assert gap1 == 0.0, f"step {s}: ranks 0 and 1 differ ({gap1}): the island did not average"
        if avg:
            assert gap2 < 1e-6, f"step {s}: rank 2 differs right after averaging ({gap2})"
        else:
            assert gap2 > 1e-6, f"step {s}: rank 2 identical between averagings: it received the island's updates"


def test_selective_refuses_islands_that_do_not_cover_the_hosts():
    strategy = Strategy.from_dict({"sync": {"mode": "selective", "islands": [[0, 1], [2]]}}).canonical()
    with RankPool(2, ranks_per_host=1) as pool:
        with pytest.raises(Exception, match="sync.islands: covers 3 hosts, but this job has 2"):
            pool.run(_rank_gaps, strategy, 1, True)


def _ssp_vs_delayed_sgd(ctx, strategy: dict, staleness: int, steps: int):
    """Train a tiny model by ``strategy``; beside it, plain SGD on the mean of all ranks' gradients applied
    ``staleness`` steps late (nothing for the first ones). The largest parameter difference at the end."""
    import torch

    from autosync.executor.apply import apply, release

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

    model, ref = net(), net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp, opt = apply(model, opt, Strategy.from_dict(strategy), init_sync=False)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(ctx.world_size)]
    pending = []
    try:
        for _ in range(steps):
            batches = [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for g in gens]
            x, y = batches[ctx.rank]
            ((ddp(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            grads = []
            for xb, yb in batches:
                ref.zero_grad()
                ((ref(xb) - yb) ** 2).mean().backward()
                grads.append([p.grad.clone() for p in ref.parameters()])
            pending.append([sum(g) / len(g) for g in zip(*grads)])
            if len(pending) > staleness:
                with torch.no_grad():
                    for p, g in zip(ref.parameters(), pending.pop(0)):
                        p -= 0.1 * g
    finally:
        release(ddp)
    return max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))


def test_ssp_is_sgd_with_gradients_applied_late():
    """ssp {staleness: s} = SGD on the ranks' mean gradient of s steps ago, exactly; with small buckets (DDP
    rebuilds them after step 1), through DDP's async all-reduce and through the worker path (a ps plan)."""
    with RankPool(2, ranks_per_host=1) as pool:
        for plan, s in (("allreduce", 1), ("ps", 1), ("ps", 2)):
            ssp = {"groups": [{"match": "*", "plan": plan}], "sync": {"mode": "ssp", "staleness": s}, "fusion": {"bucket_cap_mb": 0.0001}}
            assert max(pool.run(_ssp_vs_delayed_sgd, ssp, s, 6)) < 1e-6
            # the same reference with the wrong delay is far off: the comparison can fail
            assert min(pool.run(_ssp_vs_delayed_sgd, ssp, s - 1, 6)) > 1e-4


def _retired_across_two_releases(ctx):
    import torch

    from autosync.executor import hooks
    from autosync.executor.apply import apply, release

    strategy = Strategy.from_dict({"groups": [{"match": "*", "plan": "ps"}], "sync": {"mode": "ssp", "staleness": 1}})
    made = []
    for _ in range(2):
        model = torch.nn.Linear(4, 2)
        ddp, opt = apply(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy, init_sync=False)
        groups = list(ddp.autosync_state._subgroups)       # ssp's own copy of the group (worker path)
        ddp(torch.randn(3, 4)).sum().backward()
        opt.step()
        release(ddp)
        made.append({id(g) for g in groups})
        held = {id(g) for g in hooks._RETIRED}
        assert groups and made[-1] <= held, "a released strategy's groups are held, not dropped on any thread"
    assert not made[0] & held, "the next release dropped the earlier groups"
    return True


def test_released_groups_die_on_the_closing_thread_at_the_next_release():
    """A gloo callback thread holding the last handle of a group would join itself in ~ProcessGroupGloo (SIGABRT,
    "Resource deadlock avoided", seen in CI): released groups are held until the next release drops them."""
    with RankPool(2) as pool:
        assert pool.run(_retired_across_two_releases) == [True, True]


def _adaptive_syncs(ctx, same_data: bool, steps: int):
    import torch

    from autosync import workloads
    from autosync.executor.apply import apply, release

    model, make_batch = workloads.build("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    strategy = Strategy.from_dict({"sync": {"mode": "adaptive", "max_period": 8, "threshold": 0.0005,
                                            "warmup_steps": 1}})
    ddp, opt = apply(model, opt, strategy, init_sync=False)
    gen = torch.Generator().manual_seed(7 if same_data else 1000 + ctx.rank)
    try:
        for _ in range(steps):
            workloads.loss_of(ddp(**make_batch(16, gen))).backward()
            opt.step()
            opt.zero_grad()
    finally:
        release(ddp)
    averager = opt.averager
    return averager.syncs, max(averager.divergences)


def test_adaptive_synchronizes_less_when_ranks_agree_and_more_when_they_diverge():
    with RankPool(2, ranks_per_host=1) as pool:
        (agree, agree_div), _ = pool.run(_adaptive_syncs, True, 17)
        (differ, differ_div), _ = pool.run(_adaptive_syncs, False, 17)
    assert agree_div < 1e-6 and agree == 16 // 8, (agree, agree_div)   # only at max_period: nothing drifts
    assert differ > 2 * agree and differ_div > 0.0005, (differ, differ_div, agree)


def _asp_with_a_paused_rank(ctx, fast_steps: int, slow_steps: int, pause: float):
    """Train mlp by asp: rank 0 ``fast_steps`` steps; rank 1 ``slow_steps``, sleeping ``pause`` s before the first."""
    import time

    import torch

    from autosync import workloads
    from autosync.executor.apply import apply, release

    model, make_batch = workloads.build("mlp", seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ddp, opt = apply(model, opt, Strategy.from_dict({"sync": "asp"}), init_sync=False)
    server = opt.server
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    t0 = time.monotonic()
    try:
        if ctx.rank == 1:
            time.sleep(pause)
        for _ in range(fast_steps if ctx.rank == 0 else slow_steps):
            workloads.loss_of(ddp(**make_batch(32, gen))).backward()
            opt.step()
            opt.zero_grad()
        took = time.monotonic() - t0
    finally:
        release(ddp)   # stops the server; every rank gets the master's parameters
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return {"took": took, "pushes": server.pushes, "served": getattr(server, "served", None),
            "staleness": server.staleness, "moved": float(abs(flat - initial).max()), "params": flat}


def test_asp_makes_progress_while_a_rank_is_paused():
    """Rank 1 sleeps 6 s; rank 0 trains on (a straggler slows only itself), and rank 1's first push finds a
    master that took all of rank 0's pushes meanwhile. Both end with the master's parameters."""
    with RankPool(2, ranks_per_host=1) as pool:
        # 6 s, not 3: rank 0's 12 steps took 3.6 s with four pytest-xdist workers, 5.1 s with three beside a collection
        fast, slow = pool.run(_asp_with_a_paused_rank, 12, 3, 6.0, timeout=120)
    assert fast["took"] < 6.0, fast["took"]                          # rank 0 did not wait for the sleeper
    assert fast["served"] == slow["pushes"] == 3                     # every push of rank 1 reached the server
    assert slow["staleness"][0] == 12, slow["staleness"]             # ... after all 12 of rank 0's
    assert fast["moved"] > 1e-3, fast["moved"]                       # the master took the updates
    assert abs(fast["params"] - slow["params"]).max() == 0.0         # both end with the master


class _PerRankReference:
    """The strategy's model on this rank, beside one copy of the model per rank that a test steps by a stated rule.

    Every rank draws every rank's batches (generator 100 + r), so each process can follow all copies. ``step()``
    trains the real model on this rank's batch and returns every copy's gradient of its own rank's batch; the test
    sets the copies' gradients and calls ``step_copies()``, ``average_copies()`` when its rule says so, and ``gap()``
    compares this rank's model with its copy."""

    def __init__(self, ctx, strategy: dict, momentum: float):
        import torch

        from autosync.executor.apply import apply

        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

        self.rank, self.world = ctx.rank, ctx.world_size
        self.model, self.copies = net(), [net() for _ in range(self.world)]
        opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=momentum)
        self.ddp, self.opt = apply(self.model, opt, Strategy.from_dict(strategy), init_sync=False)
        self.ref_opts = [torch.optim.SGD(c.parameters(), lr=0.05, momentum=momentum) for c in self.copies]
        self.gens = [torch.Generator().manual_seed(100 + r) for r in range(self.world)]

    def step(self) -> list:
        import torch

        batches = [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for g in self.gens]
        x, y = batches[self.rank]
        ((self.ddp(x) - y) ** 2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        grads = []
        for c, (xb, yb) in zip(self.copies, batches):
            c.zero_grad()
            ((c(xb) - yb) ** 2).mean().backward()
            grads.append([p.grad.clone() for p in c.parameters()])
        return grads

    def step_copies(self, grad_of) -> None:
        """Step every copy r on ``grad_of(r, i)``, the gradient of its parameter i."""
        for r, (c, o) in enumerate(zip(self.copies, self.ref_opts)):
            for i, p in enumerate(c.parameters()):
                p.grad = grad_of(r, i)
            o.step()

    def average_copies(self) -> None:
        import torch

        with torch.no_grad():
            for ps in zip(*(c.parameters() for c in self.copies)):
                mean = sum(p / self.world for p in ps)
                for p in ps:
                    p.copy_(mean)

    def gap(self) -> float:
        return max(float((p - q).abs().max()) for p, q in zip(self.model.parameters(),
                                                              self.copies[self.rank].parameters()))

    def release(self) -> None:
        from autosync.executor.apply import release

        release(self.ddp)


def _local_sgd_vs_reference(ctx, strategy: dict, islands: list, warmup: int, period: int, steps: int, average: bool):
    """Train by ``strategy`` beside a reference that keeps one copy of the model per rank: before ``warmup`` every
    copy steps on the mean gradient of all ranks; after it, on the mean of its island's ranks (its own when alone),
    and after step s (0-based) with (s - warmup) % period == 0 every copy's parameters become the mean of all
    copies' (``average=False``: the broken variant that never averages). Per step, the largest difference between
    this rank's parameters and its copy's."""
    ref = _PerRankReference(ctx, strategy, momentum=0.9)
    island_of = {r: next(i for i in islands if r in i) for r in range(ref.world)}
    gaps = []
    try:
        for s in range(steps):
            grads = ref.step()

            def grad_of(r, i):
                peers = range(ref.world) if s < warmup else island_of[r]
                return sum(grads[q][i] for q in peers) / len(peers)

            ref.step_copies(grad_of)
            if average and s >= warmup and (s - warmup) % period == 0:
                ref.average_copies()
            gaps.append(ref.gap())
    finally:
        ref.release()
    return gaps


@pytest.mark.parametrize("mode, world, islands", [("local_sgd", 2, [[0], [1]]), ("selective", 3, [[0, 1], [2]])])
def test_local_sgd_and_selective_average_to_the_mean_of_the_ranks(mode, world, islands):
    """After each averaging every parameter is the mean of the ranks' parameters (and between them each island
    steps on its own mean gradient), exactly as a reference that keeps one model per rank computes it; the same
    reference without the averaging is far off, so the comparison can fail."""
    sync = {"mode": mode, "period": 3, "warmup_steps": 2}
    if mode == "selective":
        sync["islands"] = islands
    strategy = Strategy.from_dict({"sync": sync}).canonical()
    with RankPool(world, ranks_per_host=1) as pool:
        exact = pool.run(_local_sgd_vs_reference, strategy, islands, 2, 3, 9, True)
        broken = pool.run(_local_sgd_vs_reference, strategy, islands, 2, 3, 9, False)
    assert max(max(g) for g in exact) < 1e-5, exact
    assert max(max(g) for g in broken) > 1e-3, "never averaging must part from the strategy"


def _adaptive_vs_reference(ctx, strategy: dict, warmup: int, max_period: int, threshold: float, steps: int):
    """Train by ``strategy`` (adaptive) beside one model copy per rank that follows the stated rule: after the
    warm-up each copy steps on its own gradient, then D = sqrt(mean_r |x_r|^2 - |mean x|^2) / |mean x| over the
    averager's sampled coordinates decides: when D > threshold, or max_period steps passed since the last
    averaging, every copy becomes the mean. Returns per step (the largest difference to this rank's copy,
    whether the reference averaged, the D it computed)."""
    import math

    import torch

    from autosync.plans.adaptive import SAMPLE

    ref = _PerRankReference(ctx, strategy, momentum=0.0)
    world = ref.world
    n = sum(p.numel() for p in ref.model.parameters())
    picks = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:min(SAMPLE, n)].sort().values
    last, out = warmup - 1, []
    try:
        for s in range(steps):
            grads = ref.step()
            ref.step_copies(lambda r, i: sum(g[i] for g in grads) / world if s < warmup else grads[r][i])
            averaged, d = False, float("nan")
            if s >= warmup:
                xs = [torch.cat([p.detach().reshape(-1) for p in c.parameters()])[picks].double() for c in ref.copies]
                mean = sum(xs) / world
                d = math.sqrt(max(0.0, sum(float(v.pow(2).sum()) for v in xs) / world - float(mean.pow(2).sum())))
                d /= max(float(mean.norm()), 1e-30)
                if d > threshold or s - last >= max_period:
                    averaged, last = True, s
                    ref.average_copies()
            out.append((ref.gap(), averaged, d))
    finally:
        ref.release()
    return out


def test_adaptive_averages_exactly_when_its_statistic_crosses_the_threshold():
    """adaptive {max_period, threshold}: the strategy's parameters follow, step by step, a reference that averages
    exactly when D > threshold or max_period steps passed; the run has steps of each kind (averaged by the
    threshold, by the period, and not at all), so a rule that averaged at the wrong times would part from it."""
    warmup, max_period, threshold = 2, 4, 0.02
    strategy = Strategy.from_dict({"sync": {"mode": "adaptive", "warmup_steps": warmup, "max_period": max_period,
                                            "threshold": threshold}}).canonical()
    with RankPool(2, ranks_per_host=1) as pool:
        runs = pool.run(_adaptive_vs_reference, strategy, warmup, max_period, threshold, 14)
    steps = runs[0]
    assert max(gap for run in runs for gap, _, _ in run) < 1e-5, runs
    by_threshold = [s for s, (_, avg, d) in enumerate(steps) if avg and d > threshold]
    skipped = [s for s, (_, avg, d) in enumerate(steps) if s >= warmup and not avg]
    assert by_threshold and skipped, steps


def _asp_pushes(ctx, first: int, second: int):
    """Rank 0 pushes ``first`` updates (its parameters + 1 each time) while rank 1 waits; then rank 1 pushes
    ``second`` (its parameters - 0.5 each time). Returns (staleness recorded per push, final parameters)."""
    import torch
    import torch.distributed as dist

    from autosync.plans.asp import AsyncParameterServer

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    server = AsyncParameterServer(model.parameters())
    step = 1.0 if ctx.rank == 0 else -0.5

    def push(n):
        for _ in range(n):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(step)
            server.exchange()

    if ctx.rank == 0:
        push(first)
    dist.barrier()
    if ctx.rank == 1:
        push(second)
    server.finish()
    return server.staleness, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def test_asp_applies_each_push_once_divided_by_w_with_the_staleness_it_records():
    """The master takes every push exactly once, as delta / W: after rank 0's 5 pushes of +1 and rank 1's 3 of
    -0.5, every parameter moved by (5 - 1.5) / 2; rank 1's first push is 5 versions stale (rank 0 pushed 5 times
    since it pulled), the rest 0. A push applied twice, dropped, or not divided by W would read otherwise."""
    import numpy as np
    import torch

    with RankPool(2, ranks_per_host=1) as pool:
        (stale0, final0), (stale1, final1) = pool.run(_asp_pushes, 5, 3)
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in torch.nn.Linear(3, 2).parameters()]).numpy()
    assert stale0 == [0.0] * 5 and stale1 == [5.0, 0.0, 0.0], (stale0, stale1)
    np.testing.assert_allclose(final0, start + (5 * 1.0 - 3 * 0.5) / 2, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(final0, final1)                 # every rank ends with the master's
    for wrong in (start + (5 * 1.0 - 3 * 0.5), start + (5 * 1.0 - 2 * 0.5) / 2, start + 5 * 1.0 / 2):
        assert not np.allclose(final0, wrong, atol=1e-6)          # not divided by W / a push dropped / rank 1's lost
