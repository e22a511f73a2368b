"""DiLoCo's outer loop on real gloo ranks, against references that follow its stated math step by step.

Each reference keeps one copy of the model per rank (:class:`test_sync_semantics._PerRankReference`) and
carries out the rule of :mod:`autosync.plans.diloco`'s docstring by hand; each test also runs a broken variant
of the rule and checks that it parts from the strategy, so the comparison can fail.
"""
import pytest

from autosync.executor.launch import RankPool
from autosync.plans import outer
from autosync.strategy import Strategy
from test_sync_semantics import _PerRankReference, _local_sgd_vs_reference

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _strategy(**sync) -> dict:
    return Strategy.from_dict({"sync": {"mode": "diloco", **sync}}).canonical()


def _outer_reference(ctx, strategy: dict, rule: dict, steps: int, inner_momentum: float = 0.9):
    """Train by ``strategy`` beside copies that follow ``rule`` (period, warmup, fragments, delay, mix, outer_lr,
    outer_momentum, nesterov, codec): inner steps on each rank's own gradient after the warm-up, and the outer
    step of the module docstring for each fragment at its scheduled steps. Per step, this rank's largest gap."""
    import torch

    ref = _PerRankReference(ctx, strategy, momentum=inner_momentum)
    P, W, F = rule["period"], ref.world, rule["fragments"]
    members = [list(range(f, 4, F)) for f in range(F)]       # the reference net has 4 parameters
    glob, buf, pending, gaps = None, {}, {}, []

    def params(r):
        return list(ref.copies[r].parameters())

    def start(f):
        """Each rank's pseudo-gradient of fragment f, through the codec, averaged in fp32."""
        deltas = [torch.cat([(glob[i] - params(r)[i].detach()).reshape(-1) for i in members[f]]) for r in range(W)]
        codec = rule["codec"]
        return sum(outer.decode(codec, outer.encode(codec, d), d.numel()) for d in deltas) / W

    def finish(f, mean):
        mu, lr = rule["outer_momentum"], rule["outer_lr"]
        b = mean.clone() if f not in buf else mu * buf[f] + mean
        buf[f] = b
        update = (mean + mu * b) if (rule["nesterov"] and mu > 0) else (b if mu > 0 else mean)
        offset = 0
        with torch.no_grad():
            for i in members[f]:
                n = glob[i].numel()
                glob[i] -= lr * update[offset:offset + n].view_as(glob[i])
                offset += n
                for r in range(W):
                    p = params(r)[i]
                    p.copy_(rule["mix"] * p + (1 - rule["mix"]) * glob[i])

    try:
        for s in range(steps):
            grads = ref.step()
            ref.step_copies(lambda r, i: (sum(g[i] for g in grads) / W) if s < rule["warmup"] else grads[r][i])
            if s == rule["warmup"] - 1:        # bsp until here: every copy is the same
                glob = [p.detach().clone() for p in params(0)]
            elif s == rule["warmup"] == 0:      # no warm-up: averaged after the first step
                ref.average_copies()
                glob = [p.detach().clone() for p in params(0)]
            elif s >= rule["warmup"]:
                for f in [f for f, (due, _) in pending.items() if due == s]:
                    finish(f, pending.pop(f)[1])
                for f in [f for f in range(F) if (s - rule["warmup"] - f * P // F) % P == 0]:   # staggered
                    if rule["delay"]:
                        pending[f] = (s + rule["delay"], start(f))
                    else:
                        finish(f, start(f))
            gaps.append(ref.gap())
    finally:
        ref.release()
    return gaps


NESTEROV = dict(period=3, warmup=2, fragments=1, delay=0, mix=0.0, outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                codec="none")
STREAMING = dict(period=4, warmup=1, fragments=2, delay=1, mix=0.5, outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                 codec="fp4")


def _as_sync(rule: dict) -> dict:
    return dict(period=rule["period"], warmup_steps=rule["warmup"], fragments=rule["fragments"], delay=rule["delay"],
                mix=rule["mix"], outer_lr=rule["outer_lr"], outer_momentum=rule["outer_momentum"],
                nesterov=rule["nesterov"], outer_compressor=rule["codec"])


@pytest.mark.parametrize("rule", [NESTEROV, STREAMING], ids=["nesterov", "streaming_fp4"])
def test_the_outer_step_matches_an_explicit_reference_over_several_rounds(rule):
    """The Nesterov outer step on the averaged pseudo-gradient, over 5+ rounds (streaming: two fragments on a
    staggered schedule, each applied one step late and mixed half and half, sent as 4-bit codes). The broken
    variant is plain averaging (outer lr 1, no momentum, no mix) in the same schedule."""
    strategy = _strategy(**_as_sync(rule))
    broken = dict(rule, outer_lr=1.0, outer_momentum=0.0, mix=0.0)
    with RankPool(2, ranks_per_host=1) as pool:
        exact = pool.run(_outer_reference, strategy, rule, 17)
        wrong = pool.run(_outer_reference, strategy, broken, 17)
    assert max(max(g) for g in exact) < 1e-5, exact
    assert max(max(g) for g in wrong) > 1e-3, "plain averaging must part from the outer optimizer"


def test_with_outer_lr_1_and_no_momentum_it_is_periodic_parameter_averaging():
    """outer lr 1, momentum 0: theta_g - mean delta = mean theta_r, torch's PeriodicModelAverager (local SGD), to
    rounding; the reference that never averages parts from it."""
    strategy = _strategy(period=3, warmup_steps=2, outer_lr=1.0, outer_momentum=0.0)
    with RankPool(2, ranks_per_host=1) as pool:
        exact = pool.run(_local_sgd_vs_reference, strategy, [[0], [1]], 2, 3, 11, True)
        broken = pool.run(_local_sgd_vs_reference, strategy, [[0], [1]], 2, 3, 11, False)
    assert max(max(g) for g in exact) < 1e-5, exact
    assert max(max(g) for g in broken) > 1e-3


def test_a_compressed_local_sgd_average_is_the_average_of_the_decoded_parameters():
    """local_sgd through fp4: each averaging gives every rank mean_r(theta_g - decode(encode(theta_g - theta_r))),
    the parameters as the codec delivers them; the uncompressed average (the broken variant) parts from it."""
    strategy = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 3, "warmup_steps": 2,
                                            "outer_compressor": "fp4"}}).canonical()
    rule = dict(period=3, warmup=2, fragments=1, delay=0, mix=0.0, outer_lr=1.0, outer_momentum=0.0, nesterov=False,
                codec="fp4")
    with RankPool(2, ranks_per_host=1) as pool:
        exact = pool.run(_outer_reference, strategy, rule, 14)
        plain = pool.run(_outer_reference, strategy, dict(rule, codec="none"), 14)
    assert max(max(g) for g in exact) < 1e-5, exact
    assert max(max(g) for g in plain) > 1e-3, "the uncompressed average must part from the fp4 one"


def _ddp_reference(ctx, strategy: dict, average: bool, steps: int):
    """Copies that step on the mean gradient of all ranks (plain DDP with SGD), or on their own (broken)."""
    ref = _PerRankReference(ctx, strategy, momentum=0.0)
    gaps = []
    try:
        for _ in range(steps):
            grads = ref.step()
            ref.step_copies(lambda r, i: (sum(g[i] for g in grads) / ref.world) if average else grads[r][i])
            gaps.append(ref.gap())
    finally:
        ref.release()
    return gaps


def test_with_period_1_and_sgd_inside_it_is_plain_ddp():
    strategy = _strategy(period=1, warmup_steps=0, outer_lr=1.0, outer_momentum=0.0)
    with RankPool(2, ranks_per_host=1) as pool:
        exact = pool.run(_ddp_reference, strategy, True, 8)
        broken = pool.run(_ddp_reference, strategy, False, 8)
    assert max(max(g) for g in exact) < 1e-5, exact
    assert max(max(g) for g in broken) > 1e-3


def test_each_fragment_synchronizes_exactly_at_its_scheduled_steps():
    """Fragment f of F starts at the steps s >= warmup with (s - warmup - f * period // F) % period == 0: with
    period 8 and 4 fragments one fragment every 2 steps, in turn, and every fragment once per period."""
    starts = {s: outer.fragment_starts(s, 3, 8, 4) for s in range(0, 35)}
    assert all(not starts[s] for s in range(0, 3))
    assert [f for s in range(3, 35) for f in starts[s]] == [0, 1, 2, 3] * 4
    assert [s for s in range(3, 35) if starts[s]] == list(range(3, 35, 2))
    assert outer.fragment_starts(7, 3, 4, 1) == [0] and outer.fragment_starts(8, 3, 4, 1) == []
    assert outer.fragment_starts(3, 3, 4, 1) == [0] and outer.fragment_starts(2, 3, 4, 1) == []


@pytest.mark.parametrize("codec", [c for c in outer.OUTER_CODECS if c != "none"])
def test_each_outer_codec_round_trips_within_its_stated_bound(codec):
    """Values over six orders of magnitude, in blocks; the bound of :func:`outer.error_bound` holds for each
    value, and is tight (a codec that kept one bit less, or sent zeros, breaks it)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=gen) * torch.logspace(-6, 0, 3000)
    x = x[torch.randperm(3000, generator=gen)]
    block_max = F.pad(x.abs(), (0, (-x.numel()) % outer.BLOCK)).view(-1, outer.BLOCK).amax(1)
    block_max = block_max.repeat_interleave(outer.BLOCK)[:x.numel()]
    parts = outer.encode(codec, x)
    y = outer.decode(codec, parts, x.numel())
    bound = outer.error_bound(codec, x, block_max)
    err = (x - y).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float((err / bound).max()) > 0.5, "the bound is tight"
    sent = sum(p.numel() * p.element_size() for p in parts)
    assert sent <= x.numel() * outer.OUTER_CODECS[codec] + 2 * outer.BLOCK
    assert not bool(((x - torch.zeros_like(x)).abs() <= bound).all()), "zeros sent must break the bound"
    coarse = (x * 2 ** (-3)).to(torch.float16).float() * 2 ** 3 if codec in ("fp16", "bf16") else y.sign() * block_max
    assert not bool(((x - coarse).abs() <= bound).all()), "a coarser code must break the bound"


def test_a_strategy_refuses_fragments_and_delays_its_schedule_cannot_hold():
    from autosync.validation import StrategyError

    with pytest.raises(StrategyError, match="fragments"):
        Strategy.from_dict({"sync": {"mode": "diloco", "period": 2, "fragments": 4}})
    with pytest.raises(StrategyError, match="delay"):
        Strategy.from_dict({"sync": {"mode": "diloco", "period": 4, "fragments": 2, "delay": 2}})
    with pytest.raises(StrategyError, match="outer_compressor"):
        Strategy.from_dict({"sync": {"mode": "diloco", "outer_compressor": "int4"}})
    s = Strategy.from_dict({"sync": {"mode": "diloco"}})
    assert (s.sync.period, s.sync.outer_lr, s.sync.outer_momentum, s.sync.nesterov) == (8, 0.7, 0.9, True)
    assert not s.is_lossless
