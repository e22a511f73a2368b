"""Dataset store: atomic append, dedup, bad files (collect interrupted: tests/reliability)."""
import multiprocessing as mp

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autosync.datasets.schema import COLUMNS, SCHEMA
from autosync.datasets.store import DatasetError, DatasetStore


def row(ctx, h, **kw):
    base = {c: None for c in COLUMNS}
    base.update(context_id=ctx, strategy_hash=h, workload="mlp", status="ok", samples_per_s=1.0)
    base.update(kw)
    return base


def test_append_dedups_and_compacts(tmp_path):
    store = DatasetStore(tmp_path)
    assert store.append([row("a", "1"), row("a", "2"), row("a", "1")]) == 2
    assert store.append([row("a", "2", samples_per_s=9.0), row("b", "1")]) == 1
    store.compact()
    df = store.read()
    assert sorted(zip(df.context_id, df.strategy_hash)) == [("a", "1"), ("a", "2"), ("b", "1")]
    assert df.set_index(["context_id", "strategy_hash"]).loc[("a", "2"), "samples_per_s"] == 1.0  # first wins
    assert [p.name for p in tmp_path.glob("*.parquet")] == ["trials.parquet"]


def _append_many(root, worker, n):
    store = DatasetStore(root)
    for i in range(n):
        store.append([row(f"ctx{i % 5}", f"h{i}"), row("shared", f"s{i % 7}")])


def test_concurrent_appenders_store_every_row_once(tmp_path):
    procs = [mp.get_context("spawn").Process(target=_append_many, args=(tmp_path, w, 30)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    df = DatasetStore(tmp_path).read()
    assert len(df) == 30 + 7
    assert not df.duplicated(["context_id", "strategy_hash"]).any()


def test_bad_files_name_the_file(tmp_path):
    store = DatasetStore(tmp_path)
    store.append([row("a", "1")])
    store.compact()
    main = tmp_path / "trials.parquet"
    data = main.read_bytes()
    main.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"trials.parquet: unreadable Parquet"):
        store.read()
    other = SCHEMA.with_metadata({b"autosync_dataset": b"7"})
    pq.write_table(pa.Table.from_pylist([row("a", "1")], schema=other), main)
    with pytest.raises(DatasetError, match="dataset schema version 7 is not supported"):
        store.read()
    pq.write_table(pa.table({"x": [1]}), main)
    with pytest.raises(DatasetError, match="not an autosync dataset"):
        store.read()


def test_remove_deletes_only_the_given_rows(tmp_path):
    store = DatasetStore(tmp_path)
    store.append([row("a", str(i)) for i in range(5)])
    store.append([row("b", "1")])
    assert store.remove({("a", "1"), ("a", "3"), ("zz", "0")}) == 2
    df = store.read()
    assert sorted(zip(df.context_id, df.strategy_hash)) == [("a", "0"), ("a", "2"), ("a", "4"), ("b", "1")]
    assert [p.name for p in tmp_path.glob("*.parquet")] == ["trials.parquet"]
    assert store.append([row("a", "1")]) == 1  # a removed row can be stored again


def test_an_asp_trial_keys_its_efficiency_by_where_it_ran(tmp_path):
    """asp's staleness depends on timing: its trial's efficiency key names its cluster (loopback if unshaped)."""
    from autosync.strategy import Strategy

    store = DatasetStore(tmp_path)
    common = dict(workload="mlp", batch_size=64, world_size=2, ranks_per_node=1)
    asp, bsp = Strategy.from_dict({"sync": "asp"}), Strategy.from_dict({"groups": [{"compressor": "fp16"}]})
    store.append([row("mlp|b64|2x1@1gbit", asp.hash, cluster="2x1@1gbit", strategy=asp.to_json(), **common),
                  row("mlp|b64|2x1@1gbit|unshaped|gloo|cpu", asp.hash, cluster="2x1@1gbit", strategy=asp.to_json(),
                      **common),
                  row("mlp|b64|2x1@1gbit", bsp.hash, cluster="2x1@1gbit", strategy=bsp.to_json(), **common)])
    df = store.read(efficiency=False)
    keys = dict(zip(df.context_id + df.strategy_hash, df.efficiency_key))
    assert keys["mlp|b64|2x1@1gbit" + asp.hash].endswith("|on:2x1@1gbit")
    assert keys["mlp|b64|2x1@1gbit|unshaped|gloo|cpu" + asp.hash].endswith("|on:loopback")
    assert "|on:" not in keys["mlp|b64|2x1@1gbit" + bsp.hash]


def test_merge_adds_what_is_new_keeps_what_is_stored_and_says_so(tmp_path):
    """`autosync merge`: trials, efficiency rows and profiles of the sources join --data; a stored key keeps its row
    (merging twice adds nothing); a damaged source or merging a dataset into itself is one line, exit 2."""
    from autosync.datasets.schema import EFFICIENCY_SCHEMA
    from conftest import cli

    a, b = DatasetStore(tmp_path / "a"), DatasetStore(tmp_path / "b")
    a.append([row("ctx1", "1", samples_per_s=1.0), row("ctx1", "2")])
    b.append([row("ctx1", "1", samples_per_s=9.0), row("ctx2", "1"), row("ctx2", "3")])
    eff = {c: None for c in EFFICIENCY_SCHEMA.names}
    b.append_efficiency([{**eff, "efficiency_key": "k1", "status": "ok", "efficiency": 0.5}])
    a.save_profile("ctx1", {"mine": 1})
    b.save_profile("ctx1", {"theirs": 1})
    b.save_profile("ctx2", {"theirs": 2})

    out = cli("merge", tmp_path / "b", "--data", tmp_path / "a")
    assert out.returncode == 0, out.stderr
    assert "2 trials, 1 efficiency rows, 1 profiles added, 1 profiles differ" in out.stdout
    df = a.read(efficiency=False).set_index(["context_id", "strategy_hash"])
    assert sorted(df.index) == [("ctx1", "1"), ("ctx1", "2"), ("ctx2", "1"), ("ctx2", "3")]
    assert df.loc[("ctx1", "1"), "samples_per_s"] == 1.0                      # the stored row wins
    assert a.efficiency_rows()["k1"]["efficiency"] == 0.5
    assert a.load_profile_dict("ctx1") == {"mine": 1} and a.load_profile_dict("ctx2") == {"theirs": 2}
    assert cli("merge", tmp_path / "b", "--data", tmp_path / "a").stdout.startswith(
        "merge: " + str(tmp_path / "b") + ": 0 trials, 0 efficiency rows, 0 profiles added")

    fresh = cli("merge", tmp_path / "a", tmp_path / "b", "--data", tmp_path / "new")    # --data created
    assert fresh.returncode == 0 and len(DatasetStore(tmp_path / "new").read()) == 4

    (tmp_path / "b" / "part-bad.parquet").write_bytes(b"not parquet")
    for args, message in ((["merge", tmp_path / "b", "--data", tmp_path / "c"], "unreadable Parquet"),
                          (["merge", tmp_path / "a", "--data", tmp_path / "a"], "cannot merge a dataset into itself"),
                          (["merge", tmp_path / "nowhere", "--data", tmp_path / "c"], "no dataset here")):
        out = cli(*args)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "c").exists(), "nothing is written when a source is bad"


@pytest.mark.slow
def test_remeasure_replaces_a_workloads_rows_profiles_and_efficiency_everywhere_and_resumes(tmp_path,
                                                                                             store_with_profile):
    """After a workload's task changed, its stored rows are measured again on their cluster and replace the old
    ones (in every folder that held them); its efficiency rows go, other workloads' stay; a second call measures
    nothing."""
    from autosync.cluster import parse_cluster
    from tools.remeasure import remeasure
    from autosync.profiler.measure import nominal_profile
    from autosync.strategy import Strategy

    cluster = "2x1@1gbit"
    lossy = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 2}})
    folders = [tmp_path / "data", tmp_path / "v2"]
    nominal = nominal_profile(parse_cluster(cluster), "mlp")
    nominal.env["network"] = "unshaped"    # measured again on loopback: the network's profile takes seconds, not 30
    ctx = nominal.context_id
    for d in folders:
        store = store_with_profile(d, "mlp", cluster)
        store.append([row(ctx, s.hash, source=src, strategy=s.to_json(), cluster=cluster, batch_size=128,
                          world_size=2, ranks_per_node=1, timestamp=0.0)
                      for src, s in (("ddp_default", Strategy.default()), ("local_sgd_2", lossy))])
        store.append_efficiency([{"efficiency_key": "mlp|b128|w2|old", "workload": "mlp", "status": "flat"},
                                 {"efficiency_key": "gpt2-tiny|b8|w2|kept", "workload": "gpt2-tiny", "status": "ok"}])
    counts = remeasure("mlp", folders, tmp_path / "work", progress=lambda m: None)
    assert counts == {"contexts": 1, "measured": 2, "replaced": 4, "efficiency_removed": 2}
    for d in folders:
        store = DatasetStore(d)
        df = store.read(efficiency=False)
        assert sorted(df.source) == ["ddp_default", "local_sgd_2"]
        assert (df.status == "ok").all() and (df.samples_per_s > 1.0).all(), "measured again, not the old rows"
        assert (df.timestamp > 0).all()
        profile = store.load_profile_dict(ctx)
        assert profile is not None and profile != nominal.to_dict(), "the profile must be measured again"
        assert sorted(store.read_efficiency().efficiency_key) == ["gpt2-tiny|b8|w2|kept"]
    again = remeasure("mlp", folders, tmp_path / "work", progress=lambda m: None)
    assert again["measured"] == 0 and len(DatasetStore(folders[0]).read(efficiency=False)) == 2


def test_the_shipped_dataset_is_one_file_per_table():
    """Appends land as parts; what ships is compacted (``DatasetStore(...).compact()``), so the wheel carries one
    Parquet file per table."""
    from autosync.datasets import SHIPPED_DATA

    assert sorted(p.name for p in SHIPPED_DATA.glob("*.parquet")) == ["efficiency.parquet", "trials.parquet"]


def test_shipped_names_the_shipped_dataset_wherever_a_dataset_is_taken():
    from autosync import api
    from autosync.datasets import SHIPPED, SHIPPED_DATA

    assert DatasetStore(SHIPPED, create=False).root == SHIPPED_DATA
    counts, root = api.efficiency(SHIPPED, workload_names=["no-such-workload"])   # the API takes it as the CLI does
    assert root == SHIPPED_DATA and sum(counts.values()) == 0
