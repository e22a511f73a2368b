"""Faults under real conditions, each ending its trial within the time limit, with a reason, while the run
goes on: a rank SIGKILLed, a rank hanging (its peer waits inside the all-reduce), a rank aborting, a host
link taken down mid-trial, 5% packet loss on a link."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autosync.cluster import parse_cluster
from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import HOST_IF, PREFIX, EmulatedCluster, can_emulate, list_namespaces
from autosync.profiler.measure import nominal_profile
from conftest import FEW_CANDIDATES, processes_under

pytestmark = pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
FAULTS = str(Path(__file__).resolve().parents[1] / "fixtures" / "faulty.py")


def _wait(predicate, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("condition not reached")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["tune"])   # collect measures through the same measure_strategy (36 s saved)
def test_a_killed_a_hung_and_an_aborted_rank_are_recorded_and_the_run_goes_on(command, tmp_path, nothing_left):
    """Rank 1 is SIGKILLed in the first trial, hangs in the second, aborts in the third (faulty.py)."""
    workload, cluster, limit = f"{FAULTS}:faults_in_turn", parse_cluster("2x1@10gbit"), 20
    store = DatasetStore(tmp_path / "d")
    profile = nominal_profile(cluster, workload)  # stored as the emulated one, so the command starts measuring at once
    profile.env["network"] = "emulated"
    store.save_profile(profile.context_id, profile.to_dict())
    argv = (["collect", "--workloads", workload, "--clusters", "2x1@10gbit", "--per-context", "0", "--budget", "0.2"]
            if command == "collect" else
            ["tune", "--model", workload, "--cluster", "2x1@10gbit", "--measure", "5", "--objective", "throughput", "--confirm-rounds", "0", *FEW_CANDIDATES, "--storage",
             f"sqlite:///{tmp_path}/t.db"])
    env = {**os.environ, "AUTOSYNC_TEST_FAULTS": str(tmp_path / "faults")}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "autosync.cli", *argv, "--data", "d", "--timeout", str(limit)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    rows = store.read().sort_values("timestamp")
    first = rows.head(3)
    assert list(first.status) == ["failed", "timeout", "failed"], rows[["status", "reason"]]
    assert "SIGKILL" in first.reason.iloc[0] and "SIGABRT" in first.reason.iloc[2], list(first.reason)
    assert f"did not finish within {limit:g} s" in first.reason.iloc[1]
    later = rows.iloc[3:]
    assert len(later) >= 2 and (later.status == "ok").all(), later[["status", "reason"]]  # the run went on
    # only the hang waited, and only for its time limit: its row came limit + (ranks' restart) after the killed one's
    # (the whole run's wall time, once bounded here, doubled on a slow day of the machine: 109 s against 102)
    hang_s = first.timestamp.iloc[1] - first.timestamp.iloc[0]
    assert limit <= hang_s < limit + 30, (hang_s, wall)
    if command == "tune":  # the default failed: the fastest measured strategy, and a note saying why
        assert "the DDP default failed" in out.stdout
        header = (tmp_path / "strategy.yaml").read_text().splitlines()[1]
        assert header.endswith(f"strategy {later.sort_values('samples_per_s').strategy_hash.iloc[-1]}"), header
    nothing_left()


@pytest.mark.serial   # alone, so that its ranks are training when the link goes down
def test_a_host_link_taken_down_mid_trial_ends_it_within_its_time_limit(tmp_path, nothing_left):
    """Beside other tests (tried with `-n 4`) the ranks once started so slowly that the link went down before
    the trial: then the pool's start limit (120 s) applies, not the trial's limit (12 s), and it ran past 60 s."""
    proc = subprocess.Popen([sys.executable, "-m", "autosync.cli", "run", "--workload", "mlp", "--cluster",
                             "2x1@100mbit", "--steps", "50", "--timeout", "12", "--json"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mine = f"{PREFIX}{proc.pid}-"  # the CLI names its namespaces by its pid: another test's may be up
        host1 = _wait(lambda: next((n for n in list_namespaces() if n.startswith(mine) and n.endswith("-h1")), None))
        _wait(lambda: len(processes_under(tmp_path)) >= 3)  # the CLI and its two ranks
        time.sleep(3)  # the ranks import torch and start training
        t0 = time.monotonic()
        subprocess.run(["ip", "-n", host1, "link", "set", "veth0", "down"], check=True)
        out, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
    result = json.loads(out)
    assert proc.returncode == 1 and result["status"] in ("timeout", "failed"), (out, err)
    assert result["reason"] and waited < 12 + 15
    nothing_left()


def _udp_delivered(emu, count=20000):
    """Datagrams sent host 0 -> host 1, paced below the link rate, after a warm-up; returns the fraction received.

    Host 1's address is put in host 0's neighbour table first: resolving it by ARP through the lossy link failed
    now and then (a request or reply dropped, the retry a second later, after the burst), and 0 arrived."""
    mac = json.loads(subprocess.run(["ip", "-n", emu.hosts[1], "-j", "link", "show", HOST_IF], check=True,
                                    capture_output=True, text=True).stdout)[0]["address"]
    subprocess.run(["ip", "-n", emu.hosts[0], "neigh", "replace", emu.host_ip(1), "lladdr", mac, "dev", HOST_IF,
                    "nud", "permanent"], check=True)
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", emu.hosts[1], sys.executable, "-c",
         "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
         "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20);"
         f"s.bind(('{emu.host_ip(1)}', 9999)); s.settimeout(2); n = 0; print('ready', flush=True)\n"
         "try:\n    while True: n += s.recv(64) == b'x'\nexcept socket.timeout: print(n)"],
        stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "ready"
    subprocess.run(["ip", "netns", "exec", emu.hosts[0], sys.executable, "-c",
                    "import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "for i in range(10):\n"  # warm-up
                    f"    s.sendto(b'w', ('{emu.host_ip(1)}', 9999)); time.sleep(0.05)\n"
                    f"for i in range({count}):\n"
                    f"    s.sendto(b'x', ('{emu.host_ip(1)}', 9999))\n"
                    "    if i % 100 == 0: time.sleep(0.002)"], check=True)
    return int(receiver.communicate(timeout=30)[0].split()[-1]) / count


@pytest.mark.serial   # counts datagrams: a receiver starved of CPU would drop more
def test_five_percent_loss_drops_five_percent_and_a_lossy_trial_ends_within_its_limit(tmp_path, nothing_left):
    with EmulatedCluster(parse_cluster("2x1@1gbit")) as emu:
        assert _udp_delivered(emu) > 0.995  # the probe itself loses nothing
    with EmulatedCluster(parse_cluster("2x1@1gbit,loss=5%")) as emu:
        assert 0.935 <= _udp_delivered(emu) <= 0.965
    limit = 40
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "autosync.cli", "run", "--workload", "mlp", "--cluster",
                          "2x1@1gbit,loss=5%", "--steps", "3", "--warmup", "1", "--timeout", str(limit), "--json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=limit + 60)
    result = json.loads(out.stdout)
    assert time.monotonic() - t0 < limit + 30
    assert (result["status"] == "ok" and out.returncode == 0) or (result["reason"] and out.returncode == 1), result
    nothing_left()
