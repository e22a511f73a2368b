"""Sufficient-factor broadcasting (plan sfb): exact, on real gloo ranks, for every kind of layer it meets."""
import pytest

from autosync.executor.launch import RankPool
from autosync.strategy import Strategy, StrategyError

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")

SFB = {"groups": [{"plan": "sfb"}]}


def _train(ctx, strategy: dict | None, steps: int):
    """Train tests/fixtures/sfb_model.py ``steps`` steps (the second one accumulates two micro-batches under
    no_sync); plain DDP when ``strategy`` is None. Returns the parameters and, under sfb, which weights it
    formed from factors (True) or fell back to all-reducing (False)."""
    import sys
    from pathlib import Path

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    import sfb_model

    from autosync.executor.apply import apply, release

    model, make_batch = sfb_model.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if strategy is None:
        ddp = DDP(model, bucket_cap_mb=0.01)
    else:
        ddp, opt = apply(model, opt, Strategy.from_dict(strategy))
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    try:
        for step in range(steps):
            if step == 1:
                with ddp.no_sync():
                    ddp(**make_batch(4, gen)).backward()
            ddp(**make_batch(4, gen)).backward()
            opt.step()
            opt.zero_grad()
        exact = {}
        if strategy is not None:
            state = ddp.autosync_state.plan_states[0]
            exact = {state.names[pid]: ok for pid, ok in state.exact.items()}
    finally:
        if strategy is not None:
            release(ddp)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy(), exact


@pytest.mark.parametrize("world", [2, 4])
def test_sfb_equals_ddp_on_reused_transposed_bypassed_and_tied_layers(world):
    strategy = Strategy.from_dict({**SFB, "fusion": {"bucket_cap_mb": 0.01}}).canonical()
    with RankPool(world, ranks_per_host=1) as pool:
        ref = pool.run(_train, None, 4, timeout=120)
        got = pool.run(_train, strategy, 4, timeout=120)
        alone = pool.run(_train, None, 1, timeout=120)
    params, exact = got[0]
    assert exact == {"inp.weight": True, "shared.weight": True, "conv.weight": True, "side.weight": False}, exact
    for r in range(world):
        assert abs(got[r][0] - ref[r][0]).max() < 1e-5, f"rank {r}: sfb differs from DDP"
        assert abs(got[r][0] - got[0][0]).max() == 0.0, "ranks must hold identical parameters"
    assert abs(alone[0][0] - params).max() > 1e-3, "the test would prove nothing: 1 step vs 4 steps"


def test_sfb_takes_no_compressor_and_no_delayed_or_asynchronous_mode():
    with pytest.raises(StrategyError, match="fp16 works only with plan"):
        Strategy.from_dict({"groups": [{"plan": "sfb", "compressor": "fp16"}]})
    for mode in ({"mode": "ssp", "staleness": 1}, "asp"):
        with pytest.raises(StrategyError, match="sfb needs the activations"):
            Strategy.from_dict({**SFB, "sync": mode})
    assert not Strategy.from_dict({**SFB, "sync": {"mode": "local_sgd", "period": 2}}).is_lossless


def test_profile_counts_factor_rows_and_the_rule_picks_wide_layers_with_few_rows():
    from autosync.plans.sfb import poseidon_rule
    from autosync.profiler.measure import profile_model

    prof = profile_model("tests/fixtures/sfb_model.py:build", batch_size=4, repeats=1, warmup=0)
    rows = {p.name: p.factor_rows for p in prof.params}
    assert rows["inp.weight"] == 24 and rows["conv.weight"] == 24, rows          # batch 4 x 6 tokens
    assert rows["shared.weight"] == 48, "a layer used twice has its rows twice"
    assert rows["side.weight"] == 0 and rows["head.weight"] == 0 and rows["attn.out_proj.weight"] == 0
    # K (M + N) <= 2 M N / W: a 1024 x 1024 layer on 2 ranks breaks even at K = 512 rows
    assert poseidon_rule((1024, 1024), 511, 2) and not poseidon_rule((1024, 1024), 513, 2)
