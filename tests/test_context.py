"""One Context per measurement, and no silent loopback: unshaped only when asked, labelled, kept apart."""
import json

import pytest

from autosync import cli
from autosync.cluster import parse_cluster
from autosync.context import Context
from autosync.datasets.store import DatasetStore
from autosync.executor import emulate
from autosync.models import training
from autosync.profiler.measure import nominal_profile


def test_the_shipped_form_of_the_id_and_every_other_environment_apart():
    shaped = Context.of("mlp", 128, parse_cluster("2x1@100mbit"))
    assert shaped.id == "mlp|b128|2x1@100mbit" and shaped.shaped
    others = [Context.of("mlp", 128, "2x1@100mbit", network=n) for n in ("unshaped", "real", "nominal")]
    others.append(Context.of("mlp", 128, "2x1@100mbit", network="real", backend="nccl", device="cuda"))
    ids = {c.id for c in others}
    assert len(ids) == 4 and shaped.id not in ids
    assert others[0].id == "mlp|b128|2x1@100mbit|unshaped|gloo|cpu" and not others[0].shaped
    assert "NOT applied" in others[0].label
    with pytest.raises(ValueError):
        Context.of("mlp", 128, "2x1@100mbit", network="loopback")


@pytest.fixture
def no_rights(monkeypatch):
    """This machine as a user without root sees it: the namespace probe fails (the probe's own answer)."""
    monkeypatch.setattr(emulate, "_probe_result", (False, "emulating a cluster needs root (network namespaces and tc)"))


REFUSED = [
    ["run", "--workload", "mlp", "--cluster", "2x1@100mbit", "--steps", "1"],
    ["profile", "--workload", "mlp", "--cluster", "2x1@100mbit", "--out", "{tmp}/p.json"],
    ["tune", "--workload", "mlp", "--cluster", "2x1@100mbit", "--measure", "2", "--out", "{tmp}/s.yaml",
     "--data", "{tmp}/d", "--storage", "sqlite:///{tmp}/t.db"],
    ["collect", "--workloads", "mlp", "--clusters", "2x1@100mbit", "--data", "{tmp}/d"],
]


@pytest.mark.parametrize("argv", REFUSED, ids=[a[0] for a in REFUSED])
def test_without_the_rights_to_emulate_a_cluster_command_refuses_in_one_line(argv, tmp_path, capsys, no_rights,
                                                                             no_leftover_ranks):
    code = cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "cannot emulate 2x1@100mbit" in err[0] and "--unshaped" in err[0]
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "d" / "trials.parquet").exists()


def test_unshaped_when_asked_runs_on_loopback_and_says_so(capsys, no_rights, no_leftover_ranks):
    code = cli.main(["run", "--workload", "mlp", "--cluster", "2x1@100mbit", "--unshaped", "--steps", "2",
                     "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "unshaped loopback" in out and "NOT applied" in out


def test_unshaped_rows_never_train_the_cost_model(tmp_path):
    """Two contexts with the same rows: the shaped one is learned from, the unshaped one is left out."""
    store = DatasetStore(tmp_path)
    rows = []
    for network in ("emulated", "unshaped"):
        profile = nominal_profile(parse_cluster("2x1@100mbit"), "mlp")
        profile.env["network"] = network
        store.save_profile(profile.context_id, profile.to_dict())
        for i, (source, speed) in enumerate((("ddp_default", 100.0), ("random", 150.0), ("random", 80.0))):
            strategy = {"groups": [{"match": "*", "compressor": ["none", "fp16", "bf16"][i]}]}
            from autosync.strategy import Strategy

            s = Strategy.from_dict(strategy)
            rows.append({"context_id": profile.context_id, "strategy_hash": s.hash, "strategy": s.to_json(),
                         "workload": "mlp", "cluster": "2x1@100mbit", "source": source, "status": "ok",
                         "samples_per_s": speed, "reason": ""})
    store.append(rows)
    data = training.build(store)
    assert set(data.frame.context_id) == {"mlp|b128|2x1@100mbit"} and len(data.frame) == 3
    assert json.loads(store.profile_path("mlp|b128|2x1@100mbit|unshaped|gloo|cpu").read_text())[
        "environment"]["network"] == "unshaped"
