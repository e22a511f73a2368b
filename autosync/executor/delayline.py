"""A userspace delay line: latency and jitter on an emulated host link, on kernels without netem.

An emulated host link is normally a veth pair (host namespace <-> switch namespace). A link with a
latency or jitter is instead a pair of TAP devices, one in each namespace, and a process of this
module between them (``python -m autosync.executor.delayline CONFIG``)::

    [host ns] veth0 (tap) --read--> hold d --write--> p<i> (tap, bridge port) [switch ns]
    [host ns] veth0 (tap) <--write-- hold d <--read-- p<i> (tap, bridge port) [switch ns]

What the kernel sends out of one TAP the process reads, holds for ``d`` and writes into the other,
where the kernel receives it as if it came off a wire. Each direction of a host link holds a frame

    d = latency / 2 + N(0, (jitter / sqrt 2)^2)            (clipped at 0)

so a path between hosts ``a`` and ``b`` (two links) is delayed ``(lat_a + lat_b) / 2`` one way with a
standard deviation of ``sqrt((jit_a^2 + jit_b^2) / 2)``: the spec's latency and jitter for equal links.
Frames leave in the order they came (a frame's due time is at least its predecessor's): jitter
without reordering, as a real path without multipath has it. Rate and loss stay where they were:
``tbf`` and the random-drop filter on each TAP's egress, before the delay.

The TAPs carry the kernel's GSO segments whole (``IFF_VNET_HDR`` and ``TUNSETOFFLOAD`` with
checksum and TSO offloads; the virtio-net header travels with the frame, as vhost-net passes it):
one read moves up to 64 KB, so a Python loop keeps up with Gbit/s links. The TAPs are not
persistent: they vanish with this process (and with their namespace).

**Cleanup.** Every process of an emulated cluster (its delay lines, and a guardian when no link
has one) reads its standard input, a pipe from the run that started it. ``down`` on it means the
run cleans up itself: exit. End of file without ``down`` means the run died without cleaning up
(SIGKILL, a crash): the process deletes the run's namespaces and CPU cgroups, then exits. So
nothing of a killed run is left behind, not only what the next run's sweep would find.

**Priority.** Where it may (root, a CPU cgroup with real-time time), the process runs at real-time priority
(``SCHED_FIFO`` 1): it blocks in ``select`` between frames, and a woken delay line must not wait behind whatever
else the machine runs (a 1 ms link read 1.22 ms over its base beside a test suite at normal priority). Linux
keeps 5% of every second for other tasks however busy it is (``sched_rt_runtime_us``).

Only the standard library (and :mod:`autosync.executor.netns`) is used, and only Linux: ``setns`` and
``prctl`` through ctypes.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections import deque
from pathlib import Path

# linux/if_tun.h, linux/sched.h, linux/prctl.h
TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG, PR_SET_TIMERSLACK = 1, 29
FRAME_MAX = 10 + 14 + 65535 + 64      # virtio-net header, Ethernet header, the largest IP packet (a GSO segment)
BURST = 64                            # frames read from one device before the others get a turn


_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _enter(netns: str) -> None:
    """Move this (single-threaded) process into the named network namespace."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _c().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(netns: str, name: str) -> int:
    """A non-blocking fd of a new TAP device ``name`` in ``netns``, with vnet headers and GSO offloads."""
    _enter(netns)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    return fd


class Direction:
    """One direction of a link: frames read from ``src``, each written to ``dst`` when it is due."""

    def __init__(self, src: int, dst: int, delay_s: float, sigma_s: float, rng: random.Random):
        self.src, self.dst = src, dst
        self.delay_s, self.sigma_s, self.rng = delay_s, sigma_s, rng
        self.queue: deque = deque()
        self.last_due = 0.0

    def due(self, now: float) -> float:
        d = self.delay_s + (self.rng.gauss(0.0, self.sigma_s) if self.sigma_s else 0.0)
        self.last_due = max(now + max(d, 0.0), self.last_due)   # never before the frame ahead of it: no reordering
        return self.last_due

    def take(self, now: float) -> None:
        for _ in range(BURST):
            try:
                frame = os.read(self.src, FRAME_MAX)
            except BlockingIOError:
                return
            except OSError:          # the device went away (its namespace was deleted)
                raise SystemExit(0)
            self.queue.append((self.due(now), frame))

    def give(self, now: float) -> float | None:
        """Write what is due; the time until the next frame is (None when nothing waits)."""
        q = self.queue
        while q and q[0][0] <= now:
            frame = q.popleft()[1]
            try:
                os.write(self.dst, frame)
            except BlockingIOError:          # the receiving device's queue is full: dropped, as on a wire
                pass
            except OSError as e:
                if e.errno != errno.EIO:     # EIO: the other device is down (not up yet), as a wire to a dark port
                    raise SystemExit(0)      # gone: its namespace was deleted
        return q[0][0] - now if q else None


def cleanup(namespaces: list[str], cgroups: list[str]) -> None:
    """Delete a dead run's namespaces (their devices go with them) and CPU cgroups."""
    from autosync.executor.netns import remove_cgroup, run

    for ns in namespaces:
        run("ip", "netns", "delete", ns, check=False)
    for path in cgroups:
        remove_cgroup(Path(path), attempts=40)


def serve(config: dict) -> None:
    """Open the links' TAPs, say ``ready``, move frames until ``down`` or end of input (then clean up)."""
    libc = _c()
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)       # wake-ups to the microsecond, not the default 50 us slack
    try:   # a wire's delay does not wait for the hosts' work: netem holds frames in the kernel, above every process
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:   # not root, or a CPU cgroup without real-time time (cpu.rt_runtime_us 0): normal priority
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C goes to the whole process group: the run cleans up
    rng = random.Random(config.get("seed", 0))
    directions = []
    for link in config.get("links", []):
        host_fd = open_tap(link["host_ns"], link["host_dev"])
        switch_fd = open_tap(link["switch_ns"], link["switch_dev"])
        sigma = link.get("jitter_s", 0.0) / 2 ** 0.5
        delay = link.get("latency_s", 0.0) / 2
        directions += [Direction(host_fd, switch_fd, delay, sigma, rng), Direction(switch_fd, host_fd, delay, sigma, rng)]
    by_src = {d.src: d for d in directions}
    control = sys.stdin.fileno()
    os.set_blocking(control, False)
    print("ready", flush=True)
    pending = b""
    while True:
        timeout = None
        now = time.monotonic()
        for d in directions:
            wait = d.give(now)
            if wait is not None and (timeout is None or wait < timeout):
                timeout = wait
        readable, _, _ = select.select([control, *by_src], [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            if fd != control:
                by_src[fd].take(now)
                continue
            try:
                chunk = os.read(control, 4096)
            except BlockingIOError:
                continue
            if not chunk:                       # the run is gone and did not say down
                cleanup(config.get("namespaces", []), config.get("cgroups", []))
                return
            pending += chunk
            if b"down" in pending:
                return


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m autosync.executor.delayline CONFIG_JSON", file=sys.stderr)
        return 2
    serve(json.loads(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
