"""The executor on real multi-process gloo groups: equivalence, convergence, failures."""
import statistics
import time

import pytest

from autosync.executor.launch import RankPool
from autosync.executor.measure import TrialSpec, measure, params_close
from autosync.strategy import Strategy

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def canon(**raw):
    return Strategy.from_dict(raw).canonical()


LOSSLESS = {
    "allreduce (segment worker)": (canon(fusion={"bucket_cap_mb": 2}), {"force_worker": True}),
    "ps": (canon(groups=[{"plan": "ps"}]), {}),
    "sharded_ps x2": (canon(fusion={"bucket_cap_mb": 2}, groups=[{"plan": "sharded_ps", "partitions": 2}]), {}),
    "sharded_ps x4": (canon(groups=[{"plan": "sharded_ps", "partitions": 4}]), {}),
    "hierarchical_allreduce": (canon(groups=[{"plan": "hierarchical_allreduce"}]), {}),
    "mixed": (canon(fusion={"bucket_cap_mb": 1}, groups=[
        {"match": "net.0.*", "plan": "sharded_ps", "partitions": 3},
        {"match": "net.2.*", "plan": "ps", "placement": [1]},
        {"match": "net.4.*", "plan": "hierarchical_allreduce"},
        {"match": "*", "plan": "allreduce"}]), {}),
    "sfb": (canon(fusion={"bucket_cap_mb": 2}, groups=[{"match": "net.2.*", "plan": "allreduce"},
                                                      {"match": "*", "plan": "sfb"}]), {}),
}


def _spec(workload, strategy, batch, steps=8, **kw):   # a wrong sum shows at the first step; 8 let it compound
    return TrialSpec(workload, strategy, batch, warmup_steps=0, steps=steps, lr=0.05, record_params=True, **kw)


@pytest.mark.parametrize("world, ranks_per_host", [(2, 1), (4, 2)])
def test_lossless_plans_match_plain_ddp(world, ranks_per_host):
    with RankPool(world, ranks_per_host=ranks_per_host) as pool:
        ref, ref_params = measure(pool, _spec("mlp", Strategy.default().canonical(), 16, builtin_ddp=True), 120)
        assert ref.ok, ref.reason
        mismatched = {}
        for name, (strategy, extra) in LOSSLESS.items():
            result, params = measure(pool, _spec("mlp", strategy, 16, **extra), 120)
            assert result.ok, f"{name}: {result.reason}"
            assert Strategy.from_dict(strategy).is_lossless
            bad = params_close(ref_params, params)
            if bad:
                mismatched[name] = bad
        assert not mismatched, f"parameters differ from plain DDP after 8 steps: {mismatched}"


@pytest.mark.parametrize("world", [2])   # 4 ranks took 30 s of the suite; the 4-rank lossless-plans test stays
def test_row_sparse_on_ncf_matches_plain_ddp(world):
    strategy = canon(groups=[{"match": "*_emb.weight", "plan": "row_sparse"}, {"match": "*"}])
    with RankPool(world) as pool:
        ref, ref_params = measure(pool, _spec("ncf", Strategy.default().canonical(), 64, builtin_ddp=True), 120)
        result, params = measure(pool, _spec("ncf", strategy, 64), 120)
    assert ref.ok and result.ok, (ref.reason, result.reason)
    assert params_close(ref_params, params) == []


LOSSY = {
    "fp16": canon(groups=[{"compressor": "fp16"}]),
    "bf16": canon(groups=[{"compressor": "bf16"}]),
    "powersgd": canon(groups=[{"compressor": {"name": "powersgd", "rank": 2}}]),
    "topk": canon(groups=[{"compressor": {"name": "topk", "ratio": 0.01}}]),
    "local_sgd": canon(sync={"mode": "local_sgd", "period": 4, "warmup_steps": 5}),
    "diloco": canon(sync={"mode": "diloco", "period": 8, "warmup_steps": 5}),
    "streaming_diloco": canon(sync={"mode": "diloco", "period": 8, "warmup_steps": 5, "fragments": 2, "delay": 1,
                                    "mix": 0.5, "outer_compressor": "fp4"}),
}


@pytest.mark.slow
def test_lossy_options_lower_the_loss_and_say_they_are_lossy():
    with RankPool(2, ranks_per_host=1) as pool:  # two hosts: local SGD really runs apart
        for name, strategy in LOSSY.items():
            assert not Strategy.from_dict(strategy).is_lossless, name
            result, _ = measure(pool, TrialSpec(SMALL, strategy, 32, warmup_steps=0, steps=50, lr=0.002), 120)
            assert result.ok, f"{name}: {result.reason}"
            first, last = statistics.fmean(result.losses[:5]), statistics.fmean(result.losses[-5:])
            assert last < 0.8 * first, f"{name}: loss {first:.3f} -> {last:.3f} did not fall by a fifth"


def test_local_sgd_ranks_drift_apart_between_averaging_rounds():
    """Local SGD is not plain DDP in disguise: with period 4 its parameters differ from DDP's."""
    with RankPool(2, ranks_per_host=1) as pool:
        _, ref = measure(pool, _spec("mlp", Strategy.default().canonical(), 16, steps=10, builtin_ddp=True), 120)
        _, local = measure(pool, _spec("mlp", LOSSY["local_sgd"], 16, steps=10), 120)
    assert params_close(ref, local) != []


def test_an_adaptive_trial_trains_as_the_efficiency_protocol_does():
    """How often adaptive averages follows the trajectory, so its trial trains with Adam at the workload's lr (the
    efficiency protocol's), not with the trials' SGD at 0.01: the same parameters as a spec that names Adam."""
    adaptive = canon(sync={"mode": "adaptive", "max_period": 4, "threshold": 0.01, "warmup_steps": 1})
    assert TrialSpec(SMALL, adaptive, 16).recipe() == ("adam", 1e-3)
    assert TrialSpec("bert-mini", adaptive, 8).recipe() == ("adam", 1e-4)
    assert TrialSpec(SMALL, canon(), 16).recipe() == ("sgd", 0.01) == TrialSpec(SMALL, adaptive, 16, lr=0.01).recipe()

    def spec(**kw):
        return TrialSpec(SMALL, adaptive, 16, warmup_steps=0, steps=4, record_params=True, **kw)

    with RankPool(2, ranks_per_host=1) as pool:
        _, mine = measure(pool, spec(), 60)
        _, adam = measure(pool, spec(optimizer="adam", lr=1e-3), 60)
        _, sgd = measure(pool, spec(optimizer="sgd", lr=0.01), 60)
    assert params_close(mine, adam) == [] and params_close(mine, sgd) != []


FAULTS = "tests/fixtures/faulty.py"
SMALL = "tests/fixtures/small.py:build"


@pytest.mark.parametrize("workload, status, reason, limit", [
    (f"{FAULTS}:abort_on_rank1", "failed", "rank 1 died (SIGABRT): Fatal Python error: Aborted in faulty.py", 15),
    (f"{FAULTS}:terminate_on_rank1", "failed",
     "rank 1 died (SIGABRT): terminate called without an active exception | Fatal Python error: Aborted in faulty.py", 15),
    (f"{FAULTS}:hang_on_rank1", "timeout", "did not finish within 8 s", 8),   # the hang waits for all of it
    (f"{FAULTS}:mismatched_shapes", "failed", "rank", 15),
])
def test_a_failing_trial_ends_within_its_time_limit_and_kills_every_rank(workload, status, reason, limit):
    pool = RankPool(2)
    try:
        t0 = time.monotonic()
        result, _ = measure(pool, TrialSpec(workload, Strategy.default().canonical(), 8, steps=5), timeout=limit)
        elapsed = time.monotonic() - t0
        assert result.status == status and reason in result.reason, result
        assert elapsed < limit + 10
        assert not pool.alive
        # the pool recovers: the next trial starts fresh ranks and succeeds
        ok, _ = measure(pool, TrialSpec("mlp", Strategy.default().canonical(), 8, steps=2), timeout=60)
        assert ok.ok, ok.reason
    finally:
        pool.close()


def _env_of(ctx, name):
    import os

    return os.environ.get(name)


def test_ranks_see_the_launchers_environment_as_of_each_start(monkeypatch):
    """Forked ranks come from a server started with the first pool; each pool's ranks must still see the
    environment the launcher has when it starts them, as spawned ones would."""
    with RankPool(2) as first:
        assert first.run(_env_of, "AUTOSYNC_TEST_VALUE") == [None, None]
    monkeypatch.setenv("AUTOSYNC_TEST_VALUE", "set later")
    with RankPool(2) as second:
        assert second.run(_env_of, "AUTOSYNC_TEST_VALUE") == ["set later", "set later"]



def _operation_timeout_s(ctx):
    import torch
    import torch.distributed as dist

    return dist.group.WORLD._get_backend(torch.device(ctx.device)).options._timeout.total_seconds()


def test_a_collective_may_wait_on_a_slow_rank_longer_than_the_start_limit():
    """The group's operation timeout is torch's (30 min for gloo), not the pool's start limit: with the start limit
    (2 min) asp's rank 0 timed out in an all-reduce while the workers that exchange with it over a 200 Mbit/s link
    finished their first window (moe-tiny, 3x1@200mbit). By hand, a peer that joins an all-reduce 14 s late under
    ``start_timeout=10`` read "Timed out waiting 10000ms for recv" when the start limit was the group's timeout."""
    with RankPool(1, start_timeout=10) as pool:
        assert pool.run(_operation_timeout_s) == [1800.0]

LAUNCHER = """
import os, signal, sys
from autosync.executor.launch import RankPool
pool = RankPool(2)
pool.start()
with open("ranks.txt", "w") as f:
    f.write(" ".join(str(p.pid) for p in pool._procs))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_ranks_die_with_a_launcher_that_is_killed_and_its_folder_with_the_next_pool(tmp_path, monkeypatch):
    """A launcher SIGKILLed (no cleanup of its own runs) must not leave its ranks, nor the forkserver, behind; the
    folder of rank outputs it could not remove goes when the next pool starts."""
    import os
    import subprocess
    import sys
    import tempfile

    from conftest import pids_alive, processes_under

    with open(tmp_path / "stderr.txt", "w") as err:   # a file, not a pipe: ranks left alive would hold a pipe open
        out = subprocess.run([sys.executable, "-c", LAUNCHER], stdout=subprocess.DEVNULL, stderr=err, timeout=120,
                             cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})  # its temp dirs stay in here
    assert out.returncode == -9, (tmp_path / "stderr.txt").read_text()[-2000:]
    ranks = [int(p) for p in (tmp_path / "ranks.txt").read_text().split()]
    assert len(ranks) == 2
    deadline = time.monotonic() + 10
    while (pids_alive(ranks) or processes_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_alive(ranks) == [] and processes_under(tmp_path) == [], "ranks or their server outlived the launcher"
    # its folder of rank outputs is left (a SIGKILLed process removes nothing); the next pool there removes it
    left = list(tmp_path.glob("autosync-ranks-*"))
    assert len(left) == 1, left
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with RankPool(1) as pool:
        pool.start()
        assert [p.name for p in tmp_path.glob("autosync-ranks-*")] == [os.path.basename(pool._stderr_dir)]
