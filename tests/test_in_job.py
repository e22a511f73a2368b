"""In-job mode for real: a multi-node torchrun job across the emulated hosts (one torchrun per host namespace,
c10d rendezvous on host 0's address, gloo on the hosts' veths, tc shaping between them)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autosync.cluster import parse_cluster
from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import EmulatedCluster, can_emulate
from autosync.executor.launch import free_port
from conftest import FEW_CANDIDATES, processes_under

FAULTS = str(Path(__file__).resolve().parent / "fixtures" / "faulty.py")


@pytest.mark.slow
@pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
def test_a_torchrun_job_across_emulated_hosts_tunes_in_job_and_stores_a_killed_trial_as_failed_after_restart(
        tmp_path, nothing_left):
    """Rank 0 (host 0) is SIGKILLed in the job's second trial: torchrun restarts the job, the trial it died in is
    stored as failed with its reason, the search goes on, and rank 0 writes the strategy file. The job gives no
    --cluster: its shape and links are measured, to the same label before and after the restart."""
    cluster = parse_cluster("2x1@1gbit")
    workload = f"{FAULTS}:faults_in_turn"
    # rank 0's builds: the CLI's check, the profile, the DDP default's trial, then the second trial: killed there
    env = {**os.environ, "AUTOSYNC_TEST_FAULTS": str(tmp_path / "faults"), "AUTOSYNC_TEST_FAULT_RANK": "0",
           "AUTOSYNC_TEST_FAULT_ORDER": "none,none,none,kill", "TORCH_CPP_LOG_LEVEL": "ERROR",
           "TMPDIR": str(tmp_path)}   # torchrun's agent leaves a torchelastic_* log dir in $TMPDIR
    # no --cluster: the job's own shape, its links measured and put on the rate ladder (about 0.95 gbit -> 1gbit); the
    # restarted job must measure the same label, or the search could not resume in the same context
    argv = ["-m", "autosync.cli", "tune", "--in-job", "--model", workload, "--measure", "3",
            "--objective", "throughput", "--confirm-rounds", "0", *FEW_CANDIDATES, "--storage", f"sqlite:///{tmp_path}/t.db",
            "--data", "d", "--out", "s.yaml", "--timeout", "30"]
    logs = [tmp_path / f"host{h}.log" for h in range(cluster.nodes)]
    with EmulatedCluster(cluster) as emu:
        procs = [subprocess.Popen(emu.torchrun(h, argv, max_restarts=1, run_id="test"), cwd=tmp_path, env=env,
                                  stdout=open(logs[h], "w"), stderr=subprocess.STDOUT, start_new_session=True)
                 for h in range(cluster.nodes)]
        deadline = time.monotonic() + 180
        try:
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.5)
        finally:
            # torchrun starts its workers in sessions of their own: killing its group leaves them running. Asked
            # with SIGTERM, its agent stops them; what is left in the test's folder after that is killed.
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for pid in processes_under(tmp_path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    tails = "\n".join(f"--- host {h} ---\n" + log.read_text()[-2500:] for h, log in enumerate(logs))
    assert [p.returncode for p in procs] == [0, 0], tails
    rows = DatasetStore(tmp_path / "d").read().sort_values("timestamp")
    # one context across the restart (a restart keeps the label the first run stored), what was real in its id, and
    # the emulated 1 gbit link labelled within a rung of it (a busy machine read it nearer 500 mbit once)
    assert rows.context_id.nunique() == 1, set(rows.context_id)
    assert rows.context_id.iloc[0] in {f"{workload}|b32|2x1@{rate}|real|gloo|cpu" for rate in ("500mbit", "1gbit")}, \
        rows.context_id.iloc[0]
    assert len(rows) == 3 and len(set(rows.strategy_hash)) == 3, rows[["source", "status", "reason"]]
    default, killed, third = rows.to_dict("records")
    assert default["source"] == "ddp_default" and default["status"] == "ok"
    assert killed["status"] == "failed" and "the job ended while this trial ran" in killed["reason"], killed
    assert third["status"] == "ok"                                                  # the search went on
    assert (tmp_path / "faults").read_text() .count("x") > 4                        # rank 0 started again
    text = (tmp_path / "s.yaml").read_text()
    assert "real cluster, gloo/cpu" in text or "|real|gloo|cpu" in text, text[:600]
    profile = next((tmp_path / "d" / "profiles").glob("*.json")).read_text()
    assert '"network": "real"' in profile and '"hosts": 2' in profile
    assert not (tmp_path / "d" / "in-job-started.json").exists()
    nothing_left()


def test_a_restart_takes_the_label_of_the_trial_it_died_in_and_nothing_else(tmp_path):
    """The journal of a trial an earlier run of the job never finished names its context: a restart of the same
    workload, batch, shape and network takes that label (whatever its links measure now); anything else, none."""
    import json
    from types import SimpleNamespace

    from autosync.api import _restarted_job_cluster
    from autosync.context import Context
    from autosync.search.trials import Journal

    pool = SimpleNamespace(network="real", backend="gloo", device="cpu", world_size=2, ranks_per_host=1)
    store = DatasetStore(tmp_path / "d")
    assert _restarted_job_cluster(store, pool, "mlp", 128) is None                 # no unfinished trial
    Journal(store).path.write_text(json.dumps({"context_id": Context.on(pool, "mlp", 128,
                                                                         parse_cluster("2x1@500mbit")).id}))
    assert str(_restarted_job_cluster(store, pool, "mlp", 128)) == "2x1@500mbit"
    assert _restarted_job_cluster(store, pool, "mlp", 64) is None                  # another batch
    assert _restarted_job_cluster(store, pool, "resnet-tiny", 128) is None         # another workload
    four = SimpleNamespace(**{**vars(pool), "world_size": 4})
    assert _restarted_job_cluster(store, four, "mlp", 128) is None                 # another shape
    Journal(store).path.write_text("{not json")
    assert _restarted_job_cluster(store, pool, "mlp", 128) is None


def test_hosts_come_from_node_ranks_and_a_non_uniform_job_is_refused_in_one_line():
    from autosync.errors import UserError
    from autosync.executor.job import ranks_per_host

    assert ranks_per_host(["node0", "node0", "node1", "node1"]) == 2
    assert ranks_per_host(["node0", "node1"]) == 1
    with pytest.raises(UserError, match="not uniform.*node0: 2, node1: 1"):
        ranks_per_host(["node0", "node0", "node1"])
    with pytest.raises(UserError, match="consecutive"):
        ranks_per_host(["node0", "node1", "node0", "node1"])   # interleaved hosts: hierarchical groups would be wrong


def test_closing_the_job_pool_takes_its_process_groups_down_on_every_rank(tmp_path):
    """A group left for interpreter exit can abort the process after its work is done (gloo's threads vs. Python's
    teardown: a rank SIGABRTed in CI after writing its strategy); close() must leave none alive."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), str(Path(__file__).resolve().parent / "fixtures" / "job_teardown.py")],
                         cwd=tmp_path, env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank}: groups alive 0, initialized False" in out.stdout, out.stdout + out.stderr[-2000:]


def test_in_job_outside_a_job_and_a_cluster_of_another_shape_are_one_line_each(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-m", "autosync.cli", "profile", "--in-job", "--workload", "mlp",
                          "--cluster", "1x2@1gbit"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "start it with torchrun" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "autosync.cli",
                          "profile", "--in-job", "--workload", "mlp", "--cluster", "2x1@1gbit"],
                         cwd=tmp_path, env={**env, "TORCH_CPP_LOG_LEVEL": "ERROR", "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "this job has 1 host(s) x 2 rank(s)" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "profile.json").exists()
