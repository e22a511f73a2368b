"""Statistical efficiency: paired training on real ranks, and the arithmetic of the comparison."""
import json

import pytest

from autosync.datasets.store import DatasetStore
from autosync.efficiency import (BAND_LIMIT, PROTOCOL, Curve, CurveSpec, as_protocol, compare, decide, key, lr_of,
                                 reusable, short_of_pairs, steps_to, target)
from autosync.efficiency.meter import EfficiencyMeter
from autosync.efficiency.train import measure_curve
from autosync.executor.launch import RankPool
from autosync.strategy import Strategy
from conftest import SMALL   # the protocol's arithmetic does not need mlp's 5.8M parameters

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
HORIZON, EVERY = 80, 10


def test_steps_to_interpolates_the_first_crossing_and_none_when_never():
    steps, losses = [0, 10, 20, 30], [4.0, 3.0, 2.0, 1.0]
    assert steps_to(steps, losses, 2.5) == pytest.approx(15.0, abs=2.5)
    assert steps_to(steps, losses, 0.5) is None


def test_compare_decides_by_the_raw_ratio_or_its_lower_bound_and_never_reaching_as_zero():
    steps = [0, 10, 20, 30, 40]
    refs = [Curve(steps, [4, 3, 2, 1.5, 1.2], []), Curve(steps, [4, 3, 2.05, 1.5, 1.2], [])]
    same = compare(refs, refs[0], 40)
    assert same.efficiency == same.raw == 1.0 and same.within_noise and same.pairs == 1
    slower = compare(refs, Curve(steps, [4, 3.2, 2.4, 1.8, 1.4], []), 40)
    assert slower.within_noise is False and slower.efficiency == slower.raw < 0.95 and slower.band <= BAND_LIMIT
    stuck = compare(refs, Curve(steps, [4, 3.9, 3.8, 3.7, 3.6], []), 40)
    assert stuck.efficiency == 0.0 and stuck.reached_loss > 3
    with pytest.raises(ValueError):
        compare(refs[:1], refs[0], 40)
    # reference seeds that disagree by 50%: one pair cannot resolve a 0.9 from 1.0, so its lower bound decides,
    # never the 1.0 a noise rule would make of it
    wide = [Curve(steps, [4, 3, 2, 1.5, 1.2], []), Curve(steps, [4, 3.5, 3, 2.2, 1.3], [])]
    one = compare(wide, Curve(steps, [4, 3.1, 2.1, 1.6, 1.3], []), 40)
    assert one.band > BAND_LIMIT and one.within_noise and one.efficiency == pytest.approx(one.raw * (1 - one.band))
    assert one.efficiency < one.raw < 1.0
    # four pairs: the band is max(reference spread, the pairs' spread) / sqrt(4), the raw ratio the pairs' mean
    refs4 = wide + [Curve(steps, [4, 3, 2.1, 1.5, 1.2], []), Curve(steps, [4, 3.2, 2.4, 1.6, 1.2], [])]
    cands = [Curve(steps, [4, 3.1, 2.1, 1.6, 1.3], [])] * 4
    four = compare(refs4, cands, 40)
    assert four.pairs == 4 and four.raw == pytest.approx(sum(four.ratios) / 4)
    h = max(abs(1 - steps_to(r.steps, r.eval_loss, four.target_loss) / four.steps_ref) for r in refs4[1:])
    spread = max(abs(r / four.raw - 1) for r in four.ratios)
    assert four.band == pytest.approx(max(h, spread) / 2)
    assert decide(0.9, 0.1) == 0.9 and decide(0.9, 0.5) == pytest.approx(0.45) and decide(0.9, 1.5) == 0.0
    # a second seed that stalls (local SGD on vit-tiny): it counts 0, halves the mean and widens the band past the
    # limit, so the band's lower bound decides and more pairs follow
    stall = compare(refs, [refs[0], Curve(steps, [4, 3.5, 3.4, 3.4, 3.4], [])], 40)
    assert stall.ratios == [1.0, 0.0] and stall.raw == 0.5 and stall.band == pytest.approx(1 / 2 ** 0.5)
    assert stall.efficiency == pytest.approx(0.5 * (1 - 1 / 2 ** 0.5)) and stall.band > BAND_LIMIT


def test_a_candidate_trained_past_the_horizon_is_read_there_only_when_short_of_the_target_by_it():
    refs = [Curve([0, 10, 20, 30, 40], [4, 3, 2, 1.5, 1.2], []), Curve([0, 10, 20, 30, 40], [4, 3, 2.05, 1.5, 1.2], [])]
    goal, n0 = target(refs, 40), steps_to(refs[0].steps, refs[0].eval_loss, target(refs, 40))
    late = Curve([0, 10, 20, 30, 40, 50, 60, 70], [4, 3.5, 3, 2.6, 2.3, 1.8, 1.2, 1.0], [])
    eff = compare(refs, late, 40)
    assert eff.steps_cand > 40 and 0 < eff.efficiency < 0.75 and eff.efficiency == pytest.approx(n0 / eff.steps_cand)
    assert eff.final_loss_ratio == pytest.approx(2.3 / 1.2), "the final-loss ratio is read at the horizon"
    early = Curve([0, 10, 20, 30, 40, 50], [4, 3, 2, 1.5, 1.2, 0.1], [])
    assert compare(refs, early, 40).steps_cand == steps_to(early.steps[:5], early.eval_loss[:5], goal) < 40


def test_lossy_keys_ignore_plans_and_network_but_not_compression():
    a = Strategy.from_dict({"groups": [{"plan": "ps", "compressor": "fp16"}]})
    b = Strategy.from_dict({"groups": [{"plan": "allreduce", "compressor": "fp16"}], "fusion": {"bucket_cap_mb": 5}})
    c = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 1}}]})
    assert a.lossy_key() == b.lossy_key() != c.lossy_key()
    assert Strategy.from_dict({"groups": [{"plan": "ps"}]}).lossy_key() == "lossless"
    t1, t2 = (Strategy.from_dict({"groups": [{"compressor": {"name": "topk", "ratio": 0.01}}],
                                  "fusion": {"bucket_cap_mb": mb}}) for mb in (1, 25))
    assert t1.lossy_key() != t2.lossy_key(), "top-k selects per segment: its buckets change its math"
    assert key("mlp", 128, 2, 1, c) == key("mlp", 128, 2, 2, c), "bsp: the hosts do not enter"
    local = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 4}})
    assert key("mlp", 128, 4, 1, local) != key("mlp", 128, 4, 2, local)


def test_scaled_down_updates_measure_efficiency_clearly_below_one_and_the_default_exactly_one(tmp_path):
    """The same strategy trained with a 4x smaller learning rate stands in for a lossy strategy that
    shrinks every update: the paired comparison must see it, and the reference itself must read 1."""
    default = Strategy.default().canonical()
    spec = CurveSpec(SMALL, default, 64, HORIZON, EVERY, signals=False)
    with RankPool(2, ranks_per_host=1) as pool:
        refs = [measure_curve(pool, CurveSpec(SMALL, default, 64, HORIZON, EVERY, seed=s), 300) for s in (0, 1)]
        again = measure_curve(pool, spec, 300)
        slow = measure_curve(pool, CurveSpec(SMALL, default, 64, HORIZON, EVERY, lr=spec.lr / 4, signals=False), 300)
        goal = target(refs, HORIZON)
        timed = measure_curve(pool, CurveSpec(SMALL, default, 64, 2 * HORIZON, EVERY, signals=False, stop_at=goal),
                              300)
        capped = measure_curve(pool, CurveSpec(SMALL, default, 64, 2 * HORIZON, EVERY, signals=False, stop_at=0.0,
                                               max_train_s=1e-6), 300)
        # protocol 3: a candidate short of L* at the horizon trains on until it crosses it, at most extend_to steps
        slow_on = measure_curve(pool, CurveSpec(SMALL, default, 64, HORIZON, EVERY, lr=spec.lr / 4, signals=False,
                                                goal=goal, extend_to=6 * HORIZON), 300)
        never = measure_curve(pool, CurveSpec(SMALL, default, 64, HORIZON, EVERY, signals=False, goal=-1.0,
                                              extend_to=2 * HORIZON), 300)
        on_time = measure_curve(pool, CurveSpec(SMALL, default, 64, HORIZON, EVERY, signals=False, goal=goal,
                                                extend_to=2 * HORIZON), 300)
    # timed mode: stops once L* is crossed and confirmed by the next evaluation, clock read at every evaluation
    assert timed.eval_loss[-1] < refs[0].eval_loss[0] and timed.steps[-1] <= HORIZON, timed.steps
    assert 0 < timed.time_to(goal) <= timed.train_s[-1] and timed.train_s == sorted(timed.train_s)
    assert capped.steps == [0, EVERY] and capped.time_to(0.0) is None, "max_train_s must stop a run that never gets there"
    assert refs[0].eval_loss[-1] < refs[0].eval_loss[0] * 0.9, "the reference must learn over the horizon"
    assert refs[0].signals["grad_noise_scale"] > 0 and refs[0].signals["grad_error"] < 1e-6
    same = compare(refs, again, HORIZON)
    assert same.raw == 1.0 and same.efficiency == decide(1.0, same.band)
    eff = compare(refs, slow, HORIZON)
    assert eff.efficiency < 0.8, eff
    assert eff.final_loss_ratio > 1.02
    assert eff.efficiency == 0, "a 4x smaller learning rate must be short of L* at the horizon"
    assert slow_on.eval_loss[:len(slow.eval_loss)] == pytest.approx(slow.eval_loss), "training on must not change the start"
    assert HORIZON < slow_on.steps[-1] < 6 * HORIZON, slow_on.steps
    late = compare(refs, slow_on, HORIZON)
    assert 0 < late.efficiency < 0.75 and late.steps_cand > HORIZON, late
    assert late.final_loss_ratio == pytest.approx(eff.final_loss_ratio), "read at the horizon"
    assert never.steps[-1] == 2 * HORIZON, "a goal never reached trains on to extend_to, no further"
    assert on_time.steps[-1] == HORIZON, "a run that reached L* by the horizon must not train on"


def test_meter_stores_measures_once_and_reads_it_back(tmp_path):
    store = DatasetStore(tmp_path / "d")
    psgd = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 1}}]})
    same_math = Strategy.from_dict({"groups": [{"plan": "allreduce", "compressor": {"name": "powersgd", "rank": 1}}],
                                    "fusion": {"bucket_cap_mb": 4}})
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY) as meter:
        row = meter.measure(psgd)
        assert row["status"] == "ok" and 0 <= row["efficiency"] <= 1.25
        assert row["grad_error"] > 0.05, "PowerSGD rank 1 must show a compression error"
        assert row["ef_norm"] > 0
        assert meter.measure(Strategy.default())["efficiency"] == 1.0
    rows = store.read_efficiency()
    assert sorted(rows.lossy_key == "lossless") == [False, True, True]   # two reference seeds + one candidate
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY) as meter:
        assert meter.measure(same_math)["efficiency_key"] == row["efficiency_key"]
        assert meter._pool is None, "a stored efficiency must not be measured again"
    assert row["lr"] == lr_of(SMALL) == 1e-3 and lr_of("bert-mini") == 1e-4
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY, lr=1e-4) as meter:
        assert meter.stored(psgd) is None, "a row measured at another learning rate must not be reused"
    asp = Strategy.from_dict({"sync": "asp"})
    assert key(SMALL, 64, 2, 1, asp) == key(SMALL, 64, 2, 1, asp, "loopback") != key(SMALL, 64, 2, 1, asp, "2x1@1gbit")
    spec = "2x1@1gbit;node1=cpu:0.5"
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY) as meter, \
            RankPool(2, ranks_per_host=1) as cluster_ranks:
        assert meter.where(asp) == "loopback" and meter.where(psgd) is None and not meter._spec(asp, 0).timed
        meter.on_cluster(cluster_ranks, spec)       # asp's staleness follows the cluster's timing: trained there
        assert meter._spec(asp, 0).timed, "asp on the cluster must train at each rank's own pace, not in lockstep"
        assert not meter._spec(psgd, 0).timed and not meter._spec(Strategy.default(), 0).timed
        stale = {**rows.iloc[-1].to_dict(), "efficiency_key": meter.key(asp), "protocol": 1, "efficiency": 0.123}
        store.append_efficiency([stale])      # protocol 1 trained asp in lockstep on the cluster: not reused
        row = meter.measure(asp)
        assert row["status"] == "ok" and row["efficiency_key"].endswith(f"|on:{spec}") and row["protocol"] == PROTOCOL
        assert meter._pool is None, "asp must train on the cluster's ranks, not on the meter's loopback ranks"
        kept = meter.stored(asp)    # the new measurement replaces the stale row: it must not be dropped beside it
        assert (kept["protocol"], kept["timestamp"]) == (PROTOCOL, row["timestamp"]), kept
        assert meter.measure(psgd)["efficiency_key"] == rows.efficiency_key[~(rows.lossy_key == "lossless")].iloc[0]


def test_collect_again_measures_the_censored_rows_again_and_nothing_else(tmp_path):
    from autosync.efficiency.collect import collect

    store = DatasetStore(tmp_path / "d")
    topk = Strategy.from_dict({"groups": [{"compressor": {"name": "topk", "ratio": 0.01}}]})
    with EfficiencyMeter(store, SMALL, 64, 2, 1) as meter:      # the collector's horizon: its references are reused
        row = meter.measure(topk)
    censored = {**row, "protocol": 1, "efficiency": 0.0, "efficiency_raw": 0.0, "timestamp": 1.0}
    other = {**censored, "efficiency_key": row["efficiency_key"].replace(SMALL, "mlp"), "workload": "mlp"}
    store.replace_efficiency([censored, other])
    assert collect(store, [SMALL], per_group=5) == {"ok": 0, "failed": 0, "timeout": 0, "flat": 0, "stored": 0,
                                                    "rekeyed": 0}, \
        "without --again only the trials' lossy keys are measured (this store has no trials)"
    counts = collect(store, [SMALL], again=True)
    assert counts["ok"] == 1 and counts["stored"] == 0, counts
    rows = store.efficiency_rows()
    again = rows[row["efficiency_key"]]
    assert again["protocol"] == PROTOCOL and again["timestamp"] > 1.0
    assert rows[other["efficiency_key"]]["timestamp"] == 1.0, "--workloads still selects"
    assert collect(store, [SMALL], again=True)["ok"] == 0, "a row measured again is reused"
    # a row stored under an older key format (its strategy's key today differs): measured under the current key,
    # which then takes its place
    old_format = {**censored, "efficiency_key": row["efficiency_key"] + "|old-format", "timestamp": 2.0}
    store.replace_efficiency([old_format])
    counts = collect(store, [SMALL], again=True)
    # its current key is measured already: the old row goes, nothing is trained, and it is not counted as measured
    assert (counts["stored"], counts["ok"], counts["rekeyed"]) == (0, 0, 1), counts
    rows = store.efficiency_rows()
    assert old_format["efficiency_key"] not in rows and rows[row["efficiency_key"]]["protocol"] == PROTOCOL
    assert rows[row["efficiency_key"]]["timestamp"] == again["timestamp"], "the current row was measured again"


def test_rows_of_an_older_protocol_are_reused_only_where_the_measurement_did_not_change():
    asp = Strategy.from_dict({"sync": "asp"})
    psgd = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 1}}]})
    on_cluster, on_loopback, sync = (key("mlp", 128, 2, 1, asp, "2x1@1gbit;node1=cpu:0.5"),
                                     key("mlp", 128, 2, 1, asp), key("mlp", 128, 2, 1, psgd))
    # protocol 1 trained asp step for step on the cluster (lockstep): not what its key promises
    assert not reusable({"efficiency_key": on_cluster, "protocol": 1})
    assert reusable({"efficiency_key": on_cluster, "protocol": 2})
    assert reusable({"efficiency_key": on_loopback, "protocol": 1})
    assert reusable({"efficiency_key": sync, "protocol": 1})
    assert not reusable({"efficiency_key": sync, "protocol": 0})
    # protocol 2 stopped a candidate at the horizon: one that had not reached L* there is measured again
    assert reusable({"efficiency_key": sync, "protocol": 2, "status": "ok", "efficiency_raw": 0.8})
    assert not reusable({"efficiency_key": sync, "protocol": 2, "status": "ok", "efficiency_raw": 0.0})
    assert not reusable({"efficiency_key": sync, "protocol": 1, "status": "ok", "efficiency_raw": 0.0})
    assert reusable({"efficiency_key": sync, "protocol": 3, "status": "ok", "efficiency_raw": 0.0})
    # protocol 4 trains more seed pairs where the band is wide: a protocol-3 row with a wide band is measured again;
    # one with a narrow band is what protocol 4 measures with one pair, its 1.0 of the old noise rule decided again
    narrow = {"efficiency_key": sync, "protocol": 3, "status": "ok", "efficiency_raw": 0.93, "band": 0.1,
              "efficiency": 1.0, "within_noise": True, "lossy_key": "x"}
    assert reusable(narrow) and as_protocol(narrow)["efficiency"] == 0.93
    assert not reusable({**narrow, "band": 0.3})
    assert reusable({**narrow, "protocol": PROTOCOL, "band": 0.3})
    # protocol 5: modes that drift pair at least 2 seeds; a protocol-4 row is reused, and one such row with one pair
    # is short (the meter extends it), other modes' rows and rows that never reached L* are not
    local = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 8}})
    diloco = Strategy.from_dict({"sync": {"mode": "diloco", "period": 8}})
    one_pair = {"efficiency_key": key("mlp", 128, 2, 1, local), "protocol": 4, "status": "ok", "efficiency_raw": 1.1,
                "band": 0.05, "pairs": 1, "strategy": local.to_json(), "curve": "{}", "lossy_key": "x"}
    assert reusable(one_pair) and short_of_pairs(one_pair)
    assert short_of_pairs({**one_pair, "pairs": float("nan"), "protocol": 3})   # before protocol 4: one pair
    assert short_of_pairs({**one_pair, "strategy": diloco.to_json()})
    assert not short_of_pairs({**one_pair, "pairs": 2})
    assert not short_of_pairs({**one_pair, "efficiency_raw": 0.0}), "never reached L*: no further pairs"
    assert not short_of_pairs({**one_pair, "strategy": psgd.to_json()}), "a compressor pairs one seed"


def test_a_wide_band_trains_more_seed_pairs_and_stores_them(tmp_path):
    """With a band limit of 0 every candidate trains the most pairs: seeds 1 and 2 of the reference are measured
    (and stored) for it, and the row lists each pair's ratio."""
    store = DatasetStore(tmp_path / "d")
    psgd = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 1}}]})
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY, band_limit=0.0,
                         max_pairs=3) as meter:
        row = meter.measure(psgd)
    assert row["status"] == "ok" and row["pairs"] == 3 and len(json.loads(row["pair_ratios"])) == 3
    assert row["efficiency_raw"] == pytest.approx(sum(json.loads(row["pair_ratios"])) / 3, rel=1e-4)
    rows = store.read_efficiency()
    assert sorted(rows.seed[rows.lossy_key == "lossless"]) == [0, 1, 2]


def test_local_sgd_pairs_two_seeds_and_a_stored_one_pair_row_is_extended_by_one_curve(tmp_path):
    """Local SGD's stalls depend on the seed: its efficiency pairs at least 2 seeds whatever the band; a row stored
    with one pair keeps its seed-0 curve and trains only seed 1."""
    store = DatasetStore(tmp_path / "d")
    local = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 4, "warmup_steps": 2}})
    said: list[str] = []
    with EfficiencyMeter(store, SMALL, 64, 2, 1, horizon=HORIZON, eval_every=EVERY, progress=said.append) as meter:
        row = meter.measure(local)
        assert row["status"] == "ok" and row["pairs"] >= 2 and row["protocol"] == PROTOCOL, row
        ratios = json.loads(row["pair_ratios"])
        assert row["efficiency_raw"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-4)
        assert any("pairs at least 2" in s for s in said), said
        # the same row as protocol 4 stored it, with seed 0 only: extended by seed 1, seed 0 not trained again
        one = {**row, "protocol": 4, "pairs": 1, "pair_ratios": json.dumps(ratios[:1]), "efficiency_raw": ratios[0],
               "timestamp": 1.0}
        store.replace_efficiency([one])
        said.clear()
        again = meter.measure(local)
    trained = [s for s in said if s.startswith("training lossy")]
    assert len(trained) == 1 and "(seed 1)" in trained[0], said
    assert again["pairs"] == 2 and again["curve"] == row["curve"] and again["timestamp"] > 1.0
    assert json.loads(again["pair_ratios"])[0] == pytest.approx(ratios[0], rel=1e-4)
    assert again["efficiency_raw"] == pytest.approx(sum(ratios[:2]) / 2, rel=1e-3), "seed 1 trains the same again"


def test_the_efficiency_model_can_be_fitted_without_one_workload():
    from autosync.datasets import SHIPPED_DATA
    from autosync.models.efficiency_model import fit_store, training_rows

    store = DatasetStore(SHIPPED_DATA, create=False)
    frame, _ = training_rows(store)
    held = frame.workload.value_counts().index[0]
    full, without = fit_store(store), fit_store(store, without_workload=held)
    assert full.rows == len(frame) and without.rows == len(frame) - int((frame.workload == held).sum()) > 0
