"""Bad files at the command line: each gives one line naming the file and what is wrong, and exit 2."""
import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import cli

from autosync.cluster import parse_cluster
from autosync.context import Context
from autosync.datasets.schema import COLUMNS, SCHEMA
from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import can_emulate
from autosync.models.train import PRETRAINED
from autosync.profiler.measure import nominal_profile


def _rows(n=3):
    return [{**{c: None for c in COLUMNS}, "context_id": "mlp|b128|2x1@1gbit", "strategy_hash": f"{i:016x}",
             "workload": "mlp", "status": "ok", "samples_per_s": 1.0} for i in range(n)]


def _dataset(root, damage):
    store = DatasetStore(root)
    store.append(_rows())
    store.compact()
    main = root / "trials.parquet"
    if damage == "truncated":
        main.write_bytes(main.read_bytes()[:200])
    elif damage == "garbage":
        main.write_bytes(b"this is not parquet at all" * 10)
    elif damage == "other version":
        pq.write_table(pa.Table.from_pylist(_rows(), schema=SCHEMA.with_metadata({b"autosync_dataset": b"7"})), main)
    return main


def _model(root, damage):
    shutil.copytree(PRETRAINED / "regressor", root)
    model = root / "model.txt"
    if damage == "truncated model":
        model.write_text(model.read_text()[:5000])
    elif damage == "corrupt card":
        (root / "card.json").write_text("{ not json")
        return root / "card.json"
    return model


def _profile(path, damage):
    d = nominal_profile(parse_cluster("2x1@1gbit"), "mlp").to_dict()
    if damage == "other version":
        d["autosync_profile"] = 99
    elif damage == "other workload":
        d["model"]["workload"] = "bert-mini"
    path.write_text(json.dumps(d) if damage != "not json" else json.dumps(d)[:300])
    return path


def _strategy(path, damage):
    path.write_text("groups:\n  - match: 'bert.encoder.*'\n    plan: allreduce\n" if damage == "other model"
                    else "groups: [ {plan: allreduce\n")
    return path


TUNE = ["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--measure", "0"]
CASES = [
    # (what, make the bad file -> its path, argv with {f} for the file or its folder, expected text)
    ("truncated Parquet", lambda t: _dataset(t / "d", "truncated"), ["train", "--data", "d"], "unreadable Parquet"),
    ("corrupt Parquet", lambda t: _dataset(t / "d", "garbage"), ["evaluate", "--data", "d"], "unreadable Parquet"),
    ("dataset of another schema version", lambda t: _dataset(t / "d", "other version"), ["train", "--data", "d"],
     "dataset schema version 7 is not supported"),
    ("truncated model", lambda t: _model(t / "m", "truncated model"), [*TUNE, "--cost-model", "m"],
     "corrupt LightGBM model"),
    ("corrupt model card", lambda t: _model(t / "m", "corrupt card"), [*TUNE, "--cost-model", "m"],
     "corrupt model card"),
    ("strategy for another model", lambda t: _strategy(t / "s.yaml", "other model"),
     ["run", "--workload", "mlp", "--strategy", "s.yaml"], "parameters not covered by any group"),
    ("malformed strategy", lambda t: _strategy(t / "s.yaml", "malformed"),
     ["run", "--workload", "mlp", "--strategy", "s.yaml"], "malformed YAML"),
    ("profile of another version", lambda t: _profile(t / "p.json", "other version"), [*TUNE, "--profile", "p.json"],
     "profile version 99 is not supported"),
    ("profile that is not JSON", lambda t: _profile(t / "p.json", "not json"), [*TUNE, "--profile", "p.json"],
     "not valid JSON"),
    ("profile of another workload", lambda t: _profile(t / "p.json", "other workload"),
     [*TUNE, "--profile", "p.json"], "not of 'mlp|b128|2x1@1gbit'"),
]


@pytest.mark.parametrize("what, make, argv, message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_file_is_one_line_naming_it_and_exit_2(what, make, argv, message, tmp_path):
    path = make(tmp_path)
    out = cli(*argv, cwd=tmp_path)         # in this process: what a bad file does is checked before any work
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and path.name in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
def test_collect_refuses_a_stored_profile_of_another_version(tmp_path, nothing_left):
    store = DatasetStore(tmp_path / "d")
    profile = nominal_profile(parse_cluster("2x1@10gbit"), "mlp")
    context = Context.of("mlp", profile.model.batch_size, profile.cluster, "emulated")  # where collect looks
    store.save_profile(context.id, {**profile.to_dict(), "autosync_profile": 0})
    out = subprocess.run([sys.executable, "-m", "autosync.cli", "collect", "--workloads", "mlp", "--clusters",
                          "2x1@10gbit", "--data", "d"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "profile version 0 is not supported" in lines[-1]
    assert store.profile_path(context.id).name in lines[-1]
    assert store.read().empty
    nothing_left()
