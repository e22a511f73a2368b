"""The learned cost model on the shipped dataset: training, metrics, safe loading."""
import json
import shutil

import numpy as np
import pytest

from autosync.datasets.store import DatasetStore
from autosync.models import training, transfer
from autosync.models.features import FEATURES
from autosync.models.ranker import CostModel, ModelError
from autosync.datasets import SHIPPED_DATA
from autosync.models.train import PRETRAINED

pytestmark = pytest.mark.skipif(not (SHIPPED_DATA / "profiles").is_dir(), reason="no shipped dataset")


@pytest.fixture(scope="module")
def data():
    return training.build(DatasetStore(SHIPPED_DATA, create=False))


def test_training_set_is_grouped_by_context_with_the_default_as_reference(data):
    assert data.X.shape == (len(data.frame), len(FEATURES)) and np.isfinite(data.X).all()
    ctx = data.frame.context_id.to_numpy()
    assert all(ctx[i] <= ctx[i + 1] for i in range(len(ctx) - 1))
    default = data.frame[data.frame.source == "ddp_default"]
    assert np.allclose(default.speedup, 1.0)
    assert sum(data.groups()) == len(data.frame)


def test_context_metrics():
    y = np.array([1.0, 1.5, 2.0, 0.5])
    perfect = transfer.context_metrics(np.log(y), y)
    assert perfect["pairwise"] == 1.0 and perfect["regret"] == 0.0 and perfect["top5_hit"] == 1.0
    reverse = transfer.context_metrics(-np.log(y), y)
    assert reverse["pairwise"] == 0.0 and reverse["regret"] == pytest.approx(0.75)


def test_fit_save_load_predict_round_trip(tmp_path, data):
    for kind in ("ranker", "regressor"):
        model = CostModel(kind).fit(data.X, data.log_speedup, data.relevance, data.groups())
        model.save(tmp_path / kind, data_hash=data.data_hash)
        again = CostModel.load(tmp_path / kind)
        assert np.allclose(again.predict(data.X[:50]), model.predict(data.X[:50]))
        assert again.card["data_hash"] == data.data_hash and again.card["features"] == FEATURES
        assert not list((tmp_path / kind).glob("*.pkl"))


def test_pretrained_models_load_and_order_the_data_they_were_trained_on(data):
    """The shipped models reproduce the order of the measurements they were fitted to, per context (a model that
    predicted a constant, or read its features in the wrong order, would not)."""
    from scipy.stats import spearmanr

    for kind in ("ranker", "regressor"):
        model = CostModel.load(PRETRAINED / kind)
        cols = [data.features.index(f) for f in model.features]   # its own columns, by name (as CostModel.score)
        predicted = model.predict(data.X[:, cols])
        assert model.kind == kind and np.isfinite(predicted).all()
        per_context = [spearmanr(predicted[i], data.log_speedup[i]).correlation
                       for i in data.frame.groupby("context_id").indices.values() if len(i) > 3]
        assert np.nanmedian(per_context) > 0.9, (kind, np.nanmedian(per_context))
        shuffled = model.predict(data.X[:, cols[::-1]])             # the columns in the wrong order
        wrong = [spearmanr(shuffled[i], data.log_speedup[i]).correlation
                 for i in data.frame.groupby("context_id").indices.values() if len(i) > 3]
        assert np.nanmedian(wrong) < np.nanmedian(per_context) - 0.2


def test_corrupt_or_mismatched_model_files_are_refused(tmp_path):
    shutil.copytree(PRETRAINED / "regressor", tmp_path / "m")
    model_txt, card = tmp_path / "m" / "model.txt", tmp_path / "m" / "card.json"
    text = model_txt.read_text()
    model_txt.write_text(text[: len(text) // 3])
    with pytest.raises(ModelError, match="model.txt: corrupt LightGBM model"):
        CostModel.load(tmp_path / "m")
    model_txt.write_text(text)
    c = json.loads(card.read_text())
    c["features"] = c["features"][:-1] + ["a_feature_we_do_not_compute"]
    card.write_text(json.dumps(c))
    with pytest.raises(ModelError, match="trained on other features"):
        CostModel.load(tmp_path / "m")
    card.write_text("{oops")
    with pytest.raises(ModelError, match="card.json: corrupt model card"):
        CostModel.load(tmp_path / "m")
    good = CostModel.load(PRETRAINED / "regressor")
    with pytest.raises(ModelError, match=f"expected {len(good.features)} features"):
        good.predict(np.zeros((3, len(good.features) - 1)))


def test_the_simulator_pays_the_slowest_host_and_relaxed_modes_absorb_stragglers():
    """bsp on a half-speed host computes ~2x longer; asp runs at the hosts' mean speed; under intermittent
    stragglers a mode with a longer window (ssp 4, local SGD 8) pays less of them than bsp."""
    import dataclasses

    from autosync.cluster import parse_cluster
    from autosync.models.features import featurize
    from autosync.models.simulator import simulate
    from autosync.profiler import load_profile
    from autosync.strategy import Strategy

    even = load_profile(SHIPPED_DATA / "profiles" / "resnet-tiny_b32_2x1@10gbit.json")
    def on(spec):
        return dataclasses.replace(even, cluster=parse_cluster(spec))
    bsp, asp = Strategy.default(), Strategy.from_dict({"sync": "asp"})
    ssp = Strategy.from_dict({"sync": {"mode": "ssp", "staleness": 4}})
    local = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 8, "warmup_steps": 0}})
    half = on("2x1@10gbit;node1=cpu:0.5")
    assert simulate(half, bsp).compute_s == pytest.approx(2 * simulate(even, bsp).compute_s)
    assert simulate(half, asp).compute_s == pytest.approx(simulate(even, asp).compute_s / 0.75)
    strag = on("2x1@10gbit;stragglers=4x@25%,every=100ms")
    pays = {n: simulate(strag, s).compute_s / simulate(even, s).compute_s
            for n, s in (("bsp", bsp), ("ssp", ssp), ("local", local))}
    assert pays["bsp"] == pytest.approx(1 + 0.25 * 3)
    assert 1 < pays["ssp"] < pays["bsp"] and 1 < pays["local"] < pays["bsp"], pays
    f = featurize(strag, bsp)
    assert (f["min_speed"], f["straggler_load"]) == (1.0, 0.75) and featurize(half, bsp)["min_speed"] == 0.5


def test_selective_islands_come_from_the_paths_and_enter_space_baselines_simulator_and_features():
    """On 3x1@1gbit;node2=20mbit the only island choice between bsp and local SGD is hosts {0, 1} with host 2
    alone: the search space and the baselines offer it, the simulator prices the island's 1 gbit all-reduce
    (not the world's 20 mbit one), the features say how many peers receive each update. On an even cluster
    the mode is not offered."""
    from autosync.cluster import parse_cluster
    from autosync.models.features import featurize
    from autosync.models.simulator import simulate
    from autosync.plans.selective import frontier, profile_frontier
    from autosync.profiler.measure import nominal_profile
    from autosync.search.baselines import baselines
    from autosync.search.space import random_strategies
    from autosync.strategy import Strategy

    uneven = nominal_profile(parse_cluster("3x1@1gbit;node2=20mbit"), "mlp")
    assert uneven.path_bps() == ([[0.0, 1e9, 20e6], [1e9, 0.0, 20e6], [20e6, 20e6, 0.0]], "spec")
    assert [p["text"] for p in profile_frontier(uneven)] == ["0,1|2"]
    picked = baselines(uneven)["selective"]
    assert picked.sync.islands == ((0, 1), (2,)) and picked.sync.period == 4
    drawn = {s.sync.islands for s in random_strategies(uneven, 60, 0) if s.sync.mode == "selective"}
    assert drawn == {((0, 1), (2,))}
    sel, ddp = simulate(uneven, picked), simulate(uneven, Strategy.default())
    assert sel.step_s < ddp.step_s / 3, (sel, ddp)
    f = featurize(uneven, picked)
    assert (f["selective"], f["selective_period"], f["selective_reach"]) == (1.0, 4.0, pytest.approx(1 / 3))

    even = nominal_profile(parse_cluster("3x1@1gbit"), "mlp")
    assert profile_frontier(even) == [] and "selective" not in baselines(even)
    assert all(s.sync.mode != "selective" for s in random_strategies(even, 60, 0))
    # measured paths of an even cluster differ by noise (3x1@10gbit in dataset v2): one speed, no islands; a real
    # tier (1 gbit against 100 mbit, measured) still makes one
    noisy = [[0, 9542e6, 9523e6], [9542e6, 0, 9534e6], [9523e6, 9534e6, 0]]
    assert frontier(noisy, 4e6, 1, 1e-4) == []
    tiered = [[0, 956e6, 96e6], [956e6, 0, 95e6], [96e6, 95e6, 0]]
    assert [p["text"] for p in frontier(tiered, 4e6, 1, 1e-4)] == ["0,1|2"]
    # more tiers: a Pareto frontier, fastest first, each point reaching more peers than every faster one
    G, M = 1e9, 1e6
    bw = [[0, G, G, 100 * M], [G, 0, G, 100 * M], [G, G, 0, 100 * M], [100 * M] * 3 + [0]]
    bw5 = [row + [20 * M] for row in bw] + [[20 * M] * 4 + [0]]
    points = frontier(bw5, 4e6, 1, 1e-4)
    assert [p["text"] for p in points] == ["0,1,2|3|4", "0,1,2,3|4"]
    assert points[0]["time_s"] < points[1]["time_s"] and points[0]["reach"] < points[1]["reach"]


def test_collect_of_some_modes_keeps_the_default_their_baselines_and_draws_of_them_only():
    """`collect --modes diloco` adds a new mode's trials to an existing dataset's contexts: the DDP default (the
    reference the cost model ranks by), the mode's baselines, and draws whose other choices (buckets, plans,
    compressors) vary as in the full space; draws of the whole space are unchanged by the option."""
    from autosync.cluster import parse_cluster
    from autosync.profiler.measure import nominal_profile
    from autosync.search.collect import candidates_for

    profile = nominal_profile(parse_cluster("2x1@100mbit"), "mlp")
    some = candidates_for(profile, 8, 0, ("diloco",))
    names = [n for n, _ in some]
    assert names[:3] == ["ddp_default", "diloco", "streaming_diloco"] and names.count("random") == 8, names
    drawn = [s for n, s in some if n == "random"]
    assert all(s.sync.mode == "diloco" for s in drawn)
    assert len({s.sync.period for s in drawn}) > 1 and len({s.fusion.bucket_cap_mb for s in drawn}) > 1
    assert len({s.hash for _, s in some}) == len(some)
    both = candidates_for(profile, 8, 0, ("diloco", "local_sgd"))
    assert {s.sync.mode for n, s in both if n == "random"} == {"diloco", "local_sgd"}
    whole = candidates_for(profile, 8, 0)
    assert whole == candidates_for(profile, 8, 0) and len({s.sync.mode for n, s in whole if n == "random"}) > 2
