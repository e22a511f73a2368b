"""Faults under real conditions: a host link taken down mid-trial; tune interrupted and resumed."""
import json
import signal
import subprocess
import sys
import time

import optuna
import pytest

from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import can_emulate, list_namespaces

pytestmark = [pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here"),
              pytest.mark.usefixtures("no_leftover_ranks")]


def _wait(predicate, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("condition not reached")


def test_a_host_link_taken_down_mid_trial_ends_it_within_its_time_limit():
    before = set(list_namespaces())
    proc = subprocess.Popen([sys.executable, "-m", "autosync.cli", "run", "--workload", "mlp", "--cluster",
                             "2x1@100mbit", "--steps", "50", "--timeout", "25", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        host1 = _wait(lambda: next((n for n in set(list_namespaces()) - before if n.endswith("-h1")), None))
        time.sleep(12)  # ranks start, the trial runs
        t0 = time.monotonic()
        subprocess.run(["ip", "-n", host1, "link", "set", "veth0", "down"], check=True)
        out, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
    result = json.loads(out)
    assert proc.returncode == 1 and result["status"] in ("timeout", "failed"), (out, err)
    assert result["reason"] and waited < 25 + 15
    assert set(list_namespaces()) - before == set()


def test_tune_interrupted_by_sigterm_resumes_with_nothing_lost_or_duplicated(tmp_path):
    cmd = [sys.executable, "-m", "autosync.cli", "tune", "--workload", "resnet-tiny", "--cluster", "2x1@10gbit",
           "--measure", "4", "--data", "d", "--storage", f"sqlite:///{tmp_path}/t.db", "--out", "s.yaml"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = DatasetStore(tmp_path / "d")
    try:
        _wait(lambda: len(store.read()) >= 2, 300)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    first = store.read()
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    rows = store.read()
    assert not rows.duplicated(["context_id", "strategy_hash"]).any()
    assert set(first.strategy_hash) <= set(rows.strategy_hash) and len(rows) <= 4 + 1
    storage = f"sqlite:///{tmp_path}/t.db"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(storage)[0].study_name, storage=storage)
    hashes = [t.user_attrs["hash"] for t in study.get_trials()]
    assert len(hashes) == len(set(hashes)) == len(rows)  # one study trial per measured strategy
