"""Calibrated intervals, the distance from the dataset, and exploration by expected improvement
(autosync/models/uncertainty.py, autosync/search/tuner.py) on the shipped dataset."""
import math

import numpy as np
import pytest

from autosync.datasets.store import DatasetStore
from autosync.models import training, uncertainty
from autosync.models.features import featurize
from autosync.datasets import SHIPPED_DATA


@pytest.fixture(scope="module")
def shipped():
    return training.build(DatasetStore(SHIPPED_DATA, create=False))


def test_conformal_quantile_is_the_finite_sample_rank():
    scores = np.arange(1, 10, dtype=float)            # n = 9: ceil(0.8 * 10) = 8th smallest
    assert uncertainty.conformal_quantile(scores, 0.8) == 8.0
    assert uncertainty.conformal_quantile(scores[:3], 0.8) == math.inf   # too few to promise 80%


def test_the_shipped_card_was_calibrated_on_the_shipped_data_and_covers_near_its_level(shipped):
    card = uncertainty.load_card()
    assert card is not None and card["data_hash"] == shipped.data_hash, "rerun `python bench/transfer.py`"
    ev = card["held_out_workload"]["methods"]["normalized"]
    assert 0.75 <= ev["coverage"] <= 0.85, ev


def test_a_held_out_workload_is_covered_near_the_level_and_measurements_narrow_its_intervals(shipped):
    """vit-tiny held out of everything (calibration included): its rows fall inside their 80% intervals about
    80% of the time; refitted with one of its contexts measured (the tuned context: in every fold), the
    intervals there narrow, and the other vit-tiny contexts stay as wide."""
    wl = shipped.frame.workload.to_numpy()
    held = "vit-tiny"
    q = uncertainty.calibrate(shipped, held_out=held)["normalized"]
    test = (wl == held) & shipped.frame.ok.to_numpy()
    blind = uncertainty.IntervalModel.fit(shipped.subset(wl != held), q)
    mu, lo, hi = blind.bounds(shipped.X[test])
    y = shipped.log_speedup[test]
    coverage = float(((lo <= y) & (y <= hi)).mean())
    assert 0.65 <= coverage <= 0.95, coverage

    ctx = shipped.frame.context_id.to_numpy()
    tuned = f"{held}|b16|2x1@100mbit"
    assert (ctx == tuned).any()
    rows = (wl != held) | (ctx == tuned)
    data = shipped.subset(rows)
    keep = (data.frame.context_id == tuned).to_numpy()
    informed = uncertainty.IntervalModel.fit(data, q, keep=keep)
    for which, narrower in ((ctx == tuned, True), ((wl == held) & (ctx != tuned), False)):
        _, lo0, hi0 = blind.bounds(shipped.X[which])
        _, lo1, hi1 = informed.bounds(shipped.X[which])
        ratio = float(np.median(hi1 - lo1) / np.median(hi0 - lo0))
        assert (ratio < 0.7) if narrower else (ratio > 0.7), (tuned if narrower else "other contexts", ratio)


def test_a_card_built_without_a_workload_never_saw_it(shipped):
    """What a held-out benchmark hands its tunes: q calibrated without the workload (as the nested calibration
    above), and a distance reference whose nearest context to one of the workload's own is another workload's,
    where the shipped card finds the context itself."""
    from autosync.profiler import Profile
    from autosync.strategy import Strategy

    held = "vit-tiny"
    card = uncertainty.card_without(shipped, held)
    assert card["held_out"] == held and card["rows"] == int((shipped.frame.workload != held).sum())
    assert {p["workload"] for p in card["reference"]["points"]} == set(shipped.frame.workload) - {held}
    assert card["q"] == pytest.approx(uncertainty.calibrate(shipped, held_out=held)["normalized"], rel=1e-9)
    raw = DatasetStore(SHIPPED_DATA, create=False).load_profile_dict(f"{held}|b16|2x1@100mbit")
    own = featurize(Profile.from_dict(raw), Strategy.default())
    (d_shipped, w_shipped, _), = uncertainty.nearest(uncertainty.load_card()["reference"], own, 1)
    (d_held, w_held, _), = uncertainty.nearest(card["reference"], own, 1)
    assert w_shipped == held and d_shipped < 1e-3, (w_shipped, d_shipped)
    assert w_held != held and d_held > 0.1, (w_held, d_held)


def test_out_of_distribution_flags_a_new_shape_device_and_a_far_context_but_not_a_dataset_one():
    from autosync.profiler import Profile
    from autosync.strategy import Strategy

    ref = uncertainty.load_card()["reference"]
    raw = DatasetStore(SHIPPED_DATA, create=False).load_profile_dict("mlp|b128|2x1@100mbit")
    known = featurize(Profile.from_dict(raw), Strategy.default())   # a dataset context, as profiled there
    assert uncertainty.ood_reasons(ref, known) == []
    assert uncertainty.nearest(ref, known, 1)[0][1] == "mlp"
    assert "3x1" in ref["shapes"], "dataset v2 has 3-host clusters"
    assert any("shape 8x1" in r for r in uncertainty.ood_reasons(ref, {**known, "nodes": 8}))
    assert any("timed on cuda" in r for r in uncertainty.ood_reasons(ref, {**known, "device_gpu": 1.0}))
    far = uncertainty.ood_reasons(ref, {**known, "log_params": 11.0, "embedding_frac": 0.9})
    assert any("nearest dataset context" in r for r in far), far


def test_expected_improvement_measures_a_wide_interval_that_could_beat_the_best_before_a_sure_loser(tmp_path, shipped):
    """The acquisition rule itself: with the measured best at 2x, a candidate predicted 1.5x with an interval
    reaching 4x goes before one predicted 1.9x whose interval ends at 1.95x; without a measured best (or without
    intervals) the order is the point estimate's."""
    from autosync.api import load_model
    from autosync.cluster import parse_cluster
    from autosync.profiler.measure import nominal_profile
    from autosync.search.config import TuneConfig
    from autosync.search.proposer import Proposer
    from autosync.search.study import SharedStudy
    from autosync.strategy import Strategy

    profile = nominal_profile(parse_cluster("2x1@100mbit"), "mlp", 128)
    card = uncertainty.load_card()
    config = TuneConfig(objective="throughput", storage=f"sqlite:///{tmp_path}/t.db")
    tuner = Proposer(profile, load_model(), shipped, DatasetStore(tmp_path / "d"),
                     SharedStudy("t", config.storage), config, intervals_card=card)
    assert tuner.intervals is not None and tuner.model is tuner.intervals.point
    sure = Strategy.from_dict({"fusion": {"bucket_cap_mb": 50}})
    wide = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 2}}]})
    tuner.scored = {sure.hash: (math.log(1.9), sure), wide.hash: (math.log(1.5), wide)}
    tuner.bounds = {sure.hash: (math.log(1.85), math.log(1.95)), wide.hash: (math.log(0.6), math.log(4.0))}
    assert [s.hash for _, s in tuner.acquisition(math.log(2.0))] == [wide.hash, sure.hash]
    assert [s.hash for _, s in tuner.acquisition(None)] == [sure.hash, wide.hash]
    # the real bounds of the real model: finite, ordered, and the point inside
    mu, lo, hi = tuner.predict([sure, wide, Strategy.default()])
    assert np.all(lo < mu) and np.all(mu < hi)


def test_the_training_set_is_cached_by_the_dataset_and_equals_a_fresh_build(tmp_path, monkeypatch):
    """Every tune starts from the shipped training set (3 s to build): the cached one must be the same, and a
    changed dataset must miss."""
    import shutil

    monkeypatch.setenv("AUTOSYNC_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    shutil.copytree(SHIPPED_DATA, data)
    fresh = training.build(DatasetStore(data, create=False))
    assert len(list((tmp_path / "cache" / "training").iterdir())) == 1
    cached = training.build(DatasetStore(data, create=False))
    assert cached.frame.equals(fresh.frame) and np.array_equal(cached.X, fresh.X, equal_nan=True)
    assert np.array_equal(cached.log_speedup, fresh.log_speedup) and cached.features == fresh.features
    profile = next((data / "profiles").iterdir())
    profile.unlink()                                     # one context fewer: a different training set
    fewer = training.build(DatasetStore(data, create=False))
    assert len(list((tmp_path / "cache" / "training").iterdir())) == 2
    assert fewer.frame.context_id.nunique() == fresh.frame.context_id.nunique() - 1
