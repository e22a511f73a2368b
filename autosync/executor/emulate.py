"""Emulated multi-host cluster on one machine: network namespaces, veth pairs and tc.

Topology for a Cluster of N hosts::

    [ns <run>-h0] veth0 ---- p0 [ns <run>-sw: bridge br0] p1 ---- veth0 [ns <run>-h1] ...

Host i has address 198.18.0.(i+1)/24 (RFC 2544 benchmark range) on its ``veth0``. Each
host link is shaped in both directions (host egress on ``veth0``, switch egress on
``p<i>``) by netem (delay = half the host-to-host latency, jitter, loss) with a tbf child
(rate); on kernels without netem, by tbf alone, with loss as a random-drop BPF filter.
Ranks of a host run inside its namespace with gloo bound to ``veth0``; ranks of one host
reach each other through the kernel's local route, unshaped, like shared memory
on a real host. The rendezvous store lives on host 0.

Every namespace is named ``autosync-<pid>-<token>-...``: the veths live and die with
them. ``down()`` (context exit, exception, Ctrl-C, SIGTERM, interpreter exit) deletes
them; :func:`sweep` deletes what dead runs left (their pid is gone).
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import re
import secrets
import signal
import subprocess
import threading

from autosync.cluster import Cluster, Link
from autosync.errors import UserError
from autosync.executor.launch import RankPlacement, RankPool

log = logging.getLogger(__name__)
PREFIX = "autosync-"
SUBNET = "198.18.0"
HOST_IF = "veth0"
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-(sw|h\d+)$")


class EmulationError(RuntimeError):
    """The emulated network could not be built."""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def list_namespaces() -> list[str]:
    """Names of every network namespace of autosync on this machine."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(everything: bool = False) -> list[str]:
    """Delete namespaces (and with them their veths) of runs whose process is gone.

    ``everything=True`` deletes all of autosync's namespaces, live runs included.
    """
    removed = []
    for name in list_namespaces():
        m = _NAME.match(name)
        if m and not everything and pid_alive(int(m.group(1))):
            continue
        if _run("ip", "netns", "delete", name, check=False).returncode == 0:
            removed.append(name)
    return removed


_probe_result: tuple[bool, str] | None = None


def can_emulate() -> tuple[bool, str]:
    """(True, "") when this process may create namespaces; else (False, why)."""
    global _probe_result
    if _probe_result is None:
        if os.geteuid() != 0:
            _probe_result = (False, "emulating a cluster needs root (network namespaces and tc)")
        else:
            name = f"{PREFIX}{os.getpid()}-0-probe"
            proc = _run("ip", "netns", "add", name, check=False)
            _run("ip", "netns", "delete", name, check=False)
            _probe_result = (proc.returncode == 0, proc.stderr.strip())
    return _probe_result


_netem_result: bool | None = None


def has_netem() -> bool:
    """Whether this kernel has the netem qdisc (delay, jitter, loss); tbf (rate) is assumed."""
    global _netem_result
    if _netem_result is None:
        ns = f"{PREFIX}{os.getpid()}-0-netem"
        try:
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "add", "name", "vtest0", "type", "veth", "peer", "name", "vtest1")
            probe = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "vtest0", "root", "netem",
                         "delay", "1ms", check=False)
            _netem_result = probe.returncode == 0
        except EmulationError:
            _netem_result = False
        finally:
            _run("ip", "netns", "delete", ns, check=False)
    return _netem_result


def _direction_loss(path_loss: float) -> float:
    """A packet crosses two shaped egresses: 1 - (1 - p)^2 = path_loss."""
    return 1 - math.sqrt(1 - path_loss) if path_loss else 0.0


def loss_commands(netns: str, dev: str, loss: float) -> list[list[str]]:
    """tc commands dropping a random fraction ``loss`` of the packets leaving ``dev``, without netem.

    A classic-BPF classifier on the clsact egress hook, in direct-action mode::

        A = random u32                     (ld #rand, SKF_AD_RANDOM)
        if A >= loss * 2^32: continue      (TC_ACT_UNSPEC: on to the qdisc)
        else:                drop          (TC_ACT_SHOT)

    so each packet is dropped independently with probability ``loss``.
    """
    threshold = min(2**32 - 1, round(loss * 2**32))
    program = f"4,32 0 0 {2**32 - 4096 + 56},53 1 0 {threshold},6 0 0 2,6 0 0 {2**32 - 1}"
    tc = ["ip", "netns", "exec", netns, "tc"]
    return [tc + ["qdisc", "add", "dev", dev, "clsact"],
            tc + ["filter", "add", "dev", dev, "egress", "bpf", "da", "bytecode", program]]


def shape_commands(netns: str, dev: str, link: Link, netem: bool = True) -> list[list[str]]:
    """tc commands shaping the egress of ``dev``: netem (delay/jitter/loss) with a tbf child (rate).

    Without netem (``netem=False``) the tbf is the root qdisc (rate without delay) and loss, if
    any, is a random-drop BPF filter in front of it (:func:`loss_commands`).
    """
    rate_bytes = link.rate_bps / 8
    burst = max(64 * 1024, int(rate_bytes * 0.0005))        # 0.5 ms of traffic, at least one GSO packet
    limit = max(4 * 1024 * 1024, int(rate_bytes * 0.25))    # 250 ms of queue: TCP is not starved by drops
    tc = ["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev]
    tbf = ["tbf", "rate", f"{int(link.rate_bps)}bit", "burst", str(burst), "limit", str(limit)]
    if not netem:
        drop = loss_commands(netns, dev, _direction_loss(link.loss)) if link.loss else []
        return [tc + ["root", "handle", "1:", *tbf], *drop]
    delay = ["delay", f"{link.latency_s / 2 * 1e6:.0f}us"]
    if link.jitter_s:
        delay += [f"{link.jitter_s / 2 * 1e6:.0f}us", "distribution", "normal"]
    if link.loss:
        delay += ["loss", f"{_direction_loss(link.loss) * 100:.4f}%"]
    return [tc + ["root", "handle", "1:", "netem", *delay, "limit", "1000000"],
            tc + ["parent", "1:1", "handle", "10:", *tbf]]


class EmulatedCluster:
    """A Cluster brought up on this machine. Use as a context manager; ``pool()`` gives its ranks."""

    network = "emulated"   # the Context label of what its ranks measure

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.token = secrets.token_hex(3)
        self.base = f"{PREFIX}{os.getpid()}-{self.token}"
        self.switch = f"{self.base}-sw"
        self.hosts = [f"{self.base}-h{i}" for i in range(cluster.nodes)]
        self.up_ = False
        self._old_sigterm = None

    def host_ip(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def master_addr(self) -> str:
        return self.host_ip(0)

    def placements(self) -> list[RankPlacement]:
        return [RankPlacement(self.hosts[self.cluster.node_of(r)], HOST_IF) for r in range(self.cluster.world_size)]

    def pool(self, **kwargs) -> RankPool:
        """A RankPool whose ranks live on the emulated hosts."""
        return RankPool(self.cluster.world_size, ranks_per_host=self.cluster.ranks_per_node,
                        placements=self.placements(), master_addr=self.master_addr, network=self.network, **kwargs)

    def torchrun(self, node: int, argv: list[str], port: int = 29400, max_restarts: int = 0,
                 run_id: str = "autosync") -> list[str]:
        """The command line of host ``node``'s part of a multi-node torchrun job on this cluster.

        One ``torchrun`` per host, run inside the host's namespace, ``--nproc-per-node`` the
        cluster's ranks per host, c10d rendezvous on host 0's address, gloo bound to the host's
        veth. Two pitfalls handled here: the namespaces share the machine's hostname, so
        torchrun cannot tell that host 0 owns the rendezvous address (``is_host`` says so) and
        would advertise an unreachable name (``--local-addr`` gives each agent its host's address); and
        all hosts share this machine's cores, so each rank gets cores / ranks threads, as a RankPool's
        ranks do (torchrun sets ``OMP_NUM_THREADS=1`` only for several ranks per node: with one, two
        ranks of two threads each on 2 cores profiled resnet-tiny's forward 37x slower).
        ``argv``: what follows torchrun's own options (``-m autosync.cli tune --in-job ...``).
        """
        import sys

        threads = max(1, (os.cpu_count() or 1) // self.cluster.world_size)   # the hosts share this machine's cores
        return ["ip", "netns", "exec", self.hosts[node], "env", f"GLOO_SOCKET_IFNAME={HOST_IF}",
                f"OMP_NUM_THREADS={threads}",
                sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.cluster.nodes),
                "--nproc-per-node", str(self.cluster.ranks_per_node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{self.master_addr}:{port}", "--rdzv-id", run_id,
                "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}", "--local-addr", self.host_ip(node),
                "--max-restarts", str(max_restarts), *argv]

    # --- lifecycle -------------------------------------------------------------------------
    def up(self) -> "EmulatedCluster":
        ok, why = can_emulate()
        if not ok:
            raise EmulationError(why)
        self.netem = has_netem()
        links = [self.cluster.link_of(i) for i in range(self.cluster.nodes)]
        if not self.netem and any(l.latency_s or l.jitter_s for l in links):
            raise EmulationError("this kernel has no netem qdisc: latency and jitter cannot be emulated here "
                                 "(bandwidth and loss can; drop them from the cluster spec)")
        left = sweep()
        if left:
            log.warning("removed %d namespaces left by dead autosync runs", len(left))
        atexit.register(self.down)
        self._trap_sigterm()
        self.up_ = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "set", "lo", "up")
        _run("ip", "-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            port = f"p{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", HOST_IF,
                 "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.host_ip(i)}/24", "dev", HOST_IF)
            _run("ip", "-n", ns, "link", "set", HOST_IF, "up")
            for key, value in (("net.ipv4.tcp_rmem", "4096 131072 67108864"),
                               ("net.ipv4.tcp_wmem", "4096 131072 67108864")):
                _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={value}", check=False)
            link = self.cluster.link_of(i)
            for cmd in (shape_commands(ns, HOST_IF, link, self.netem)
                        + shape_commands(self.switch, port, link, self.netem)):
                _run(*cmd)
        log.info("emulated cluster %s up as %s", self.cluster, self.base)

    def down(self) -> None:
        """Delete every namespace of this cluster (their veths and qdiscs go with them)."""
        if not self.up_:
            return
        self.up_ = False
        for ns in [*self.hosts, self.switch]:
            _run("ip", "netns", "delete", ns, check=False)
        atexit.unregister(self.down)
        self._restore_sigterm()

    def _trap_sigterm(self) -> None:
        """SIGTERM unwinds like Ctrl-C, so that ``with`` blocks tear the network down."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            def _raise(signum, frame):
                raise KeyboardInterrupt("SIGTERM")
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


class LocalCluster:
    """What the user asks for with ``--unshaped``: every rank on this host's loopback, the spec's links not applied.

    Its pool's measurements carry the Context network ``unshaped`` and are never filed
    under the shaped spec.
    """

    network = "unshaped"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def pool(self, **kwargs) -> RankPool:
        return RankPool(self.cluster.world_size, ranks_per_host=self.cluster.ranks_per_node, network=self.network,
                        **kwargs)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        pass


UNSHAPED_HINT = ("pass --unshaped (Python: unshaped=True) to measure on unshaped loopback instead; "
                 "such results are labelled unshaped and never mixed with shaped data")


def emulate(cluster: Cluster, unshaped: bool = False):
    """An EmulatedCluster; or, when the user explicitly asks for ``unshaped``, a LocalCluster.

    Without the rights to emulate it raises UserError (one line; never a silent fallback).
    """
    if unshaped:
        log.warning("unshaped: %d ranks on this host's loopback; the links of %s are not applied",
                    cluster.world_size, cluster)
        return LocalCluster(cluster)
    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot emulate {cluster}: {why}; {UNSHAPED_HINT}")
    return EmulatedCluster(cluster)
