"""SIGINT and SIGTERM during collect and during tune, then the same command again: it resumes,
no stored row is lost or duplicated, the Optuna study is intact, nothing of ours keeps running."""
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest

from autosync.executor.emulate import can_emulate
from conftest import FEW_CANDIDATES, SMALL   # SMALL: what is interrupted is the command, not the model
# (mlp's 14 collect trials took 21 s, SMALL's 9 s)

pytestmark = pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")


def _interrupt_when(cmd, cwd, ready, sig, limit=300.0):
    """Start ``cmd``, send ``sig`` once ``ready()`` holds; returns the exit status."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal,
    # even when the tests run as a background job (a non-interactive shell starts those with SIGINT ignored)
    try:
        deadline = time.monotonic() + limit
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "never got far enough to be interrupted"
            time.sleep(0.1)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode


@pytest.mark.slow
def test_collect_interrupted_by_sigint_resumes_without_loss_or_duplicates(tmp_path, nothing_left, store_with_profile):
    """SIGINT here, SIGTERM in the tune test below (one interruption each: they share the unwinding path, and the
    suite's time is short; both used to take both signals in turn)."""
    cmd = [sys.executable, "-m", "autosync.cli", "collect", "--workloads", SMALL, "--clusters", "2x1@10gbit",
           "--per-context", "2", "--data", "d", "--budget", "0.3"]
    store = store_with_profile(tmp_path / "d", SMALL, "2x1@10gbit")
    seen = None
    for sig, rows in ((signal.SIGINT, 2),):
        assert _interrupt_when(cmd, tmp_path, lambda: len(store.read()) >= rows, sig) == 130
        nothing_left()
        now = store.read()
        assert len(now) >= rows and not now.duplicated(["context_id", "strategy_hash"]).any()
        if seen is not None:
            pd.testing.assert_frame_equal(now.iloc[: len(seen)], seen)  # nothing stored was lost or changed
        seen = now
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = store.read()
    assert f"{len(seen)} already stored" in done.stdout
    assert not after.duplicated(["context_id", "strategy_hash"]).any()
    pd.testing.assert_frame_equal(after.iloc[: len(seen)], seen)
    nothing_left()


MEASURED = 5


@pytest.mark.slow
def test_tune_interrupted_by_sigterm_resumes_with_the_study_intact(tmp_path, nothing_left, store_with_profile):
    storage = f"sqlite:///{tmp_path}/t.db"
    cmd = [sys.executable, "-m", "autosync.cli", "tune", "--model", SMALL, "--cluster", "2x1@10gbit",
           "--measure", str(MEASURED), "--objective", "throughput", "--confirm-rounds", "0", *FEW_CANDIDATES,
           "--data", "d", "--storage", storage, "--out", "s.yaml"]
    # five measured: a tune of this 17k-parameter model finished its second trial (CI, 2026-12-06), and once its
    # third (CI, 2026-12-07, 3 test workers on 2 cores), and exited before the signal that followed its first row
    store = store_with_profile(tmp_path / "d", SMALL, "2x1@10gbit")

    def study_hashes():
        summaries = optuna.get_all_study_summaries(storage)
        if not summaries:
            return []
        study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
        return [t.user_attrs["hash"] for t in study.get_trials() if t.state.is_finished()]

    seen = None
    for sig, rows in ((signal.SIGTERM, 1),):
        assert _interrupt_when(cmd, tmp_path, lambda: len(store.read()) >= rows, sig) == 130
        nothing_left()
        now = store.read()
        if seen is not None:
            pd.testing.assert_frame_equal(now.iloc[: len(seen)], seen)
        assert set(study_hashes()) <= set(now.strategy_hash)  # the study holds only what was measured
        seen = now
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    rows = store.read()
    assert not rows.duplicated(["context_id", "strategy_hash"]).any()
    pd.testing.assert_frame_equal(rows.iloc[: len(seen)], seen)
    assert len(rows) <= MEASURED + 1
    hashes = study_hashes()
    assert len(hashes) == len(set(hashes)) == len(rows)  # one study trial per measured strategy, none twice
    assert (tmp_path / "s.yaml").exists()
    nothing_left()
