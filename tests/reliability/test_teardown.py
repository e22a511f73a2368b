"""A run interrupted (Ctrl-C, SIGTERM) or losing a rank (SIGKILL) leaves no rank, namespace or cgroup behind.

Each test checks only what its own CLI made (the namespaces and cgroups carry the CLI's pid, the ranks descend from
it), so these run beside other tests; moved out of the serial tests/test_emulation.py on 2026-12-03."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from autosync.executor.emulate import PREFIX, can_emulate, list_cgroups, list_namespaces
from conftest import pids_alive, processes_under, rank_pids

pytestmark = [pytest.mark.skipif(not can_emulate()[0], reason=f"cannot emulate here: {can_emulate()[1]}"),
              pytest.mark.usefixtures("no_leftover_ranks")]
HANG = "tests/fixtures/faulty.py:hang_on_rank1"


def made_by(proc):
    """The namespaces and CPU cgroups of the CLI process ``proc``."""
    mine = f"{PREFIX}{proc.pid}-"
    return {n for n in list_namespaces() if n.startswith(mine)} | \
        {f"cgroup {p.name}" for p in list_cgroups() if p.name.startswith(mine)}


def _start_run(*extra):
    return subprocess.Popen([sys.executable, "-m", "autosync.cli", "run", "--workload", HANG, "--cluster",
                             "2x1@1gbit", "--steps", "5", "--timeout", "120", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C reaches it even
    # when the tests run as a background job, whose children a non-interactive shell starts with SIGINT ignored


def _wait_for_ranks(proc, n=2, limit=60):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ranks = rank_pids(proc.pid)
        if len(ranks) >= n and made_by(proc):
            time.sleep(3)  # let the trial get going: rank 1 hangs at its third step
            return ranks
        time.sleep(0.2)
    raise AssertionError("ranks did not start")


def _stop(proc):
    """End the CLI the way a user would (SIGTERM lets it take down its namespaces), SIGKILL only if it hangs: a
    failing assertion must not turn into namespaces left behind for every later test."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_running_trial_leaves_nothing(sig):
    """Ctrl-C reaches the CLI alone; SIGTERM comes as `pkill -f`, a `timeout` wrapper or a batch system's cancel
    sends it: to the CLI and its ranks, and again to the CLI while it is tearing down (a second SIGTERM once
    interrupted the namespaces' deletion and left them behind)."""
    proc = _start_run()
    try:
        ranks = _wait_for_ranks(proc)
        proc.send_signal(sig)
        if sig == signal.SIGTERM:
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):   # the CLI's own teardown may have ended it: CI
                    os.kill(pid, sig)                            # once found rank 1 gone (as pkill would skip it)
            for _ in range(3):
                time.sleep(0.2)
                proc.poll() is None and proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    assert proc.returncode == 130, proc.stderr.read()
    time.sleep(0.5)
    assert not pids_alive(ranks)
    assert made_by(proc) == set()


@pytest.mark.parametrize("sync", ["bsp", "asp"])
def test_a_killed_rank_fails_the_trial_and_leaves_nothing(sync, tmp_path):
    """Also under asp, whose server thread on rank 0 would wait for the dead worker forever."""
    strategy = tmp_path / "s.yaml"
    strategy.write_text(f"sync: {{mode: {sync}}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "autosync.cli", "run", "--workload", "mlp", "--cluster",
                             "2x1@100mbit", "--steps", "30", "--timeout", "120", "--json", "--strategy", str(strategy)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = _wait_for_ranks(proc)
        os.kill(ranks[-1], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode == 1, err
    assert '"status": "failed"' in out and "SIGKILL" in out
    assert not pids_alive(ranks)
    assert made_by(proc) == set()


def _ours():
    return set(list_namespaces()) | {f"cgroup {p.name}" for p in list_cgroups()}


KILLED_RUN = """
import sys, time
from autosync.cluster import parse_cluster
from autosync.executor.emulate import EmulatedCluster
from autosync.executor.linkcheck import check_links
cluster = parse_cluster(sys.argv[1])
with EmulatedCluster(cluster) as emu, emu.pool(threads_per_rank=1) as pool:
    pool.start()
    print(emu.base, flush=True)
    check_links(pool, cluster, seconds=60)       # a transfer far longer than the test waits
"""


@pytest.mark.parametrize("spec", ["2x1@100mbit,20ms;node1=cpu:0.5", "2x1@100mbit"])
def test_a_run_killed_mid_transfer_leaves_nothing_behind(spec, tmp_path):
    """SIGKILL gives the run no chance to clean up: its delay lines (or, without latency, its guardian) see their
    input pipe end and delete its namespaces (TAPs and veths go with them) and cgroups; its ranks die with it."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, spec], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path, stderr=subprocess.DEVNULL)
    base = proc.stdout.readline().strip()
    assert base.startswith("autosync-"), base
    time.sleep(2)                                    # mid-transfer
    assert any(n.startswith(base) for n in _ours())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and ([n for n in _ours() if base in n] or processes_under(tmp_path)):
        time.sleep(0.2)
    assert [n for n in _ours() if base in n] == [] and processes_under(tmp_path) == []
