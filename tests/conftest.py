"""Shared helpers: every test that starts ranks checks that none of them outlives it."""
import os

import pytest


def pids_alive(pids):
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def _is_rank(pid):
    """Rank processes are multiprocessing spawn children (not its resource tracker)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"spawn_main" in f.read()
    except OSError:
        return False


def child_pids():
    """PIDs whose parent is this test process (rank processes are our direct children)."""
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z" and _is_rank(entry):
                out.append(int(entry))
    return out


@pytest.fixture
def no_leftover_ranks():
    """Fails the test if a rank process it started is still running afterwards."""
    before = set(child_pids())
    yield
    left = [p for p in child_pids() if p not in before]
    assert not pids_alive(left), f"rank processes left running: {left}"
