"""Three `autosync collect` processes appending to one dataset at once: two race on the same context,
one measures another; every row is stored exactly once and the dataset stays readable."""
import subprocess
import sys
from pathlib import Path

import pytest

from autosync.cluster import parse_cluster
from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import can_emulate
from autosync.profiler.measure import nominal_profile
from autosync.search.collect import candidates_for

pytestmark = pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
MODEL = str(Path(__file__).resolve().parents[1] / "fixtures" / "faulty.py") + ":faults_in_turn"  # no fault set


@pytest.mark.slow
def test_three_collects_at_once_store_every_row_exactly_once(tmp_path, nothing_left):
    store, expected = DatasetStore(tmp_path / "d"), set()
    for spec in ("2x1@10gbit", "2x1@5gbit"):
        profile = nominal_profile(parse_cluster(spec), MODEL)
        profile.env["network"] = "emulated"  # stands in for the emulated profile, so collect skips profiling
        store.save_profile(profile.context_id, profile.to_dict())
        expected |= {(profile.context_id, s.hash) for _, s in candidates_for(profile, 2, 0)}
    procs = [subprocess.Popen([sys.executable, "-m", "autosync.cli", "collect", "--workloads", MODEL, "--clusters",
                               spec, "--per-context", "2", "--budget", "0.2", "--timeout", "60", "--data", "d"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for spec in ("2x1@10gbit", "2x1@10gbit", "2x1@5gbit")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = store.read()
    assert set(zip(rows.context_id, rows.strategy_hash)) == expected
    assert len(rows) == len(expected) and (rows.status == "ok").all(), rows[["status", "reason"]]
    assert [p.name for p in (tmp_path / "d").glob("*.parquet")] == ["trials.parquet"]  # compacted, readable
    nothing_left()
