"""Emulated multi-host cluster on one machine: network namespaces, veth pairs (or TAP pairs) and tc.

Topology for a Cluster of N hosts::

    [ns <run>-h0] veth0 ---- p0 [ns <run>-sw: bridge br0] p1 ---- veth0 [ns <run>-h1] ...

Host i has address 198.18.0.(i+1)/24 (RFC 2544 benchmark range) on its ``veth0``. Each
host link is shaped in both directions (host egress on ``veth0``, switch egress on
``p<i>``): rate by tbf, loss by a random-drop BPF filter in front of it, and latency and jitter
(each direction half of the host-to-host latency) by a userspace delay line
(:mod:`autosync.executor.delayline`): a link with a latency is a pair of TAP devices named like the
veths, with a process between them that holds each frame for its delay. On kernels with netem,
netem delays instead (and drops, with the tbf as its child). Ranks of a host run inside its
namespace with gloo bound to ``veth0``; ranks of one host reach each other through the kernel's
local route, unshaped, like shared memory on a real host. The rendezvous store lives on host 0.
TCP's buffers in each namespace are sized for the longest path (:func:`socket_buffer_bytes`).

Compute: a host at speed ``s`` (``;nodeK=cpu:s``) runs each of its ranks under a CPU limit of
``s x cores / ranks`` cores, its fair share of this machine scaled by ``s`` (CFS bandwidth
control: cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2 ``cpu.max``), one cgroup
per rank, which the rank joins before it starts torch. Intermittent stragglers
(``;stragglers=Xx@P%``) are a thread of this process that, every slice, draws whether one random
rank computes X times slower for the slice (its quota divided by X) and restores it after.
Those cgroups weigh 64 times a default process (v1 ``cpu.shares``, v2 ``cpu.weight``): a speed is a
fraction of a share the host has, so another busy process on this machine takes what the ranks leave,
not part of the full-speed hosts' share (at the default weight a CPU hog beside a ``cpu:0.5`` host
read it at 0.72 of the full-speed host, whose share the hog had cut to ~0.8 of a core).
``$AUTOSYNC_RANK_WEIGHT`` sets another multiple (``tests/beside.py`` gives the ranks of the tests it runs at
low priority its own quarter, so that they stay below the timed tests as the rest of those tests does).

Every namespace and cgroup is named ``autosync-<pid>-<token>-...``: the devices live and die with
the namespaces. ``down()`` (context exit, exception, Ctrl-C, SIGTERM, interpreter exit) deletes
them; if this process dies without it (SIGKILL), its delay lines, or a guardian process when no link
has one, delete them; :func:`sweep` deletes what any dead run left (its pid is gone).
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import random
import re
import secrets
import select
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from autosync.cluster import Cluster, Link
from autosync.errors import UserError, sigterm_as_interrupt
from autosync.executor.fidelity import beyond
from autosync.executor.launch import RankPlacement, RankPool, pid_alive
from autosync.executor.netns import PREFIX, EmulationError, remove_cgroup
from autosync.executor.netns import run as _run

log = logging.getLogger(__name__)
SUBNET = "198.18.0"
HOST_IF = "veth0"
# Every namespace and cgroup autosync makes is named autosync-<pid of its creator>-...: clusters
# (<pid>-<hex>-sw|h<i>|r<i>) and probes (<pid>-0-probe...). The pid says whose it is: a sweep (and the tests'
# leak checks) leave a live process's alone, probes included (a probe of a run beside this one once read as left).
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
CFS_PERIOD_US = 10_000   # short periods: a limited rank is throttled in 10 ms slices, not 100 ms bursts
RANK_WEIGHT = 64        # a limited cluster's rank cgroup against a default process (see the module's docstring)
KEEPER_START_S = 30.0    # a delay line that has not opened its devices by then is an error



def list_namespaces() -> list[str]:
    """Names of every network namespace of autosync on this machine."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def cgroup_root() -> tuple[Path, int] | None:
    """(directory, version) of the cgroup hierarchy whose CPU bandwidth autosync may set; None when there is none."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    try:
        if "cpu" in (v2 / "cgroup.subtree_control").read_text().split() and os.access(v2, os.W_OK):
            return v2, 2
    except OSError:
        pass
    return None


def list_cgroups() -> list[Path]:
    root = cgroup_root()
    return sorted(p for p in root[0].glob(f"{PREFIX}*") if p.is_dir()) if root else []


def _remove_cgroup(path: Path) -> bool:
    if remove_cgroup(path):
        return True
    log.warning("could not remove cgroup %s", path)
    return False


def sweep(everything: bool = False) -> list[str]:
    """Delete namespaces (and with them their veths) and CPU cgroups of runs whose process is gone.

    ``everything=True`` deletes all of autosync's namespaces and cgroups, live runs included.
    """
    removed = []
    for name in list_namespaces():
        m = _NAME.match(name)
        if m and not everything and pid_alive(int(m.group(1))):
            continue
        if _run("ip", "netns", "delete", name, check=False).returncode == 0:
            removed.append(name)
    for path in list_cgroups():
        m = _NAME.match(path.name)
        if m and not everything and pid_alive(int(m.group(1))):
            continue
        if _remove_cgroup(path):
            removed.append(f"cgroup {path.name}")
    return removed


class CpuLimits:
    """One CPU cgroup per rank of an emulated cluster: host speeds and intermittent stragglers.

    A rank of host ``k`` gets ``speed_k x cores / world`` cores (no limit at speed 1). While a
    straggler slice is on, the chosen rank's limit is divided by the slowdown.
    """

    def __init__(self, base: str, cluster: Cluster, cores: int | None = None):
        root = cgroup_root()
        if root is None:
            raise EmulationError("uneven compute needs a writable cgroup CPU controller (v1 cpu.cfs_quota_us or "
                                 "v2 cpu.max under /sys/fs/cgroup); this machine has none")
        self.root, self.version = root
        self.cluster = cluster
        self.share = (cores or os.cpu_count() or 1) / cluster.world_size
        self.paths = [self.root / f"{base}-r{r}" for r in range(cluster.world_size)]
        self.slowed: int | None = None          # the rank a straggler slice slows now
        self.lifted = False
        self.slices = self.straggling = 0       # slices drawn, slices with a straggler
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def create(self) -> None:
        scale = float(os.environ.get("AUTOSYNC_RANK_WEIGHT", RANK_WEIGHT))
        knob, weight = ("cpu.shares", max(2, int(1024 * scale))) if self.version == 1 else \
            ("cpu.weight", min(10_000, max(1, int(100 * scale))))
        for p in self.paths:
            p.mkdir()
            (p / knob).write_text(str(weight))
        for r in range(len(self.paths)):
            self._apply(r)
        if self.cluster.stragglers is not None:
            self._thread = threading.Thread(target=self._stragglers, name="autosync-stragglers", daemon=True)
            self._thread.start()

    def speed(self, rank: int) -> float:
        """The compute speed rank ``rank`` runs at now (1 = a full share)."""
        if self.lifted:
            return 1.0
        s = self.cluster.speed_of(self.cluster.node_of(rank))
        if rank == self.slowed and self.cluster.stragglers is not None:
            s /= self.cluster.stragglers.slowdown
        return s

    def _apply(self, rank: int) -> None:
        speed = self.speed(rank)
        quota = -1 if speed >= 1.0 else max(1000, int(speed * self.share * CFS_PERIOD_US))
        path = self.paths[rank]
        try:
            if self.version == 1:
                (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {CFS_PERIOD_US}")
        except OSError as e:
            if path.exists():
                raise EmulationError(f"cannot set the CPU limit of {path}: {e}") from e

    def lift(self, lifted: bool) -> None:
        """Remove (``True``) or restore (``False``) every limit: the full-share reference of a compute check."""
        self.lifted = lifted
        for r in range(len(self.paths)):
            self._apply(r)

    def _stragglers(self) -> None:
        st = self.cluster.stragglers
        rng = random.Random(0)   # the same draws every run
        while not self._stop.wait(st.slice_s):
            previous = self.slowed
            self.slowed = rng.randrange(len(self.paths)) if rng.random() < st.fraction else None
            self.slices += 1
            self.straggling += self.slowed is not None
            for r in {previous, self.slowed} - {None}:
                self._apply(r)

    def remove(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for p in self.paths:
            _remove_cgroup(p)


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
    """Whether this kernel has the netem qdisc (delay, jitter, loss); tbf (rate) is assumed.

    The probe adds a netem qdisc in an anonymous network namespace (``unshare -n``), which ends with the probe's
    process: nothing is named, so nothing is left whatever happens to this one."""
    global _netem_result
    if _netem_result is None:
        try:
            probe = _run("unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                         check=False)
            _netem_result = probe.returncode == 0
        except OSError:   # no unshare (util-linux) here
            _netem_result = False
    return _netem_result


def socket_buffer_bytes(cluster: Cluster) -> int:
    """The most a TCP socket of an emulated host may buffer (``tcp_rmem`` / ``tcp_wmem`` max): 64 MB, or four
    times the longest path's bandwidth-delay product (rate x round trip), whichever is more.

    Linux lends half a socket's buffer to the application's data (``tcp_adv_win_scale`` 1), so a buffer of twice
    the product is what one stream needs to keep a path full; four leaves room for the queue tbf adds. 64 MB covers
    1 gbit at 250 ms one way."""
    worst = 0.0
    for a in range(cluster.nodes):
        for b in range(a + 1, cluster.nodes):
            rate, latency = cluster.path(a, b)
            worst = max(worst, rate / 8 * 2 * (latency + cluster.link_of(a).jitter_s + cluster.link_of(b).jitter_s))
    return int(max(64 << 20, 4 * worst))


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


def shape_commands(netns: str, dev: str, link: Link, netem: bool = True, whole_segments: bool = False
                   ) -> list[list[str]]:
    """tc commands shaping the egress of ``dev``: netem (delay/jitter/loss) with a tbf child (rate).

    Without netem (``netem=False``) the tbf is the root qdisc (rate without delay) and loss, if
    any, is a random-drop BPF filter in front of it (:func:`loss_commands`).

    tbf's burst is 0.5 ms of traffic, at least 64 KB; with ``whole_segments`` (a delay line's TAP) at least 128 KB.
    tbf cuts a packet larger than its burst into MTU-sized segments, and a delay line must get the kernel's 64 KB
    GSO segments whole: cut, a single TCP stream at 1 gbit with 10 ms carried 0.72 of the rate (its segments
    overflowed the devices' queues; 34,604 retransmits in 8 s), whole, 0.96 and none.
    """
    rate_bytes = link.rate_bps / 8
    burst = max((128 if whole_segments else 64) * 1024, int(rate_bytes * 0.0005))
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

    def __init__(self, cluster: Cluster, delay_lines: bool = False):
        self.cluster = cluster
        self.delay_lines = delay_lines          # every link through a delay line, even at 0 ms (its base latency)
        self.delayed: set[int] = set()          # hosts whose link runs through a delay line
        self.keepers: list = []                 # delay-line / guardian processes
        self.token = secrets.token_hex(3)
        self.base = f"{PREFIX}{os.getpid()}-{self.token}"
        self.switch = f"{self.base}-sw"
        self.hosts = [f"{self.base}-h{i}" for i in range(cluster.nodes)]
        self.up_ = False
        self._old_sigterm = None
        self.limits: CpuLimits | None = None
        self.beyond: list[str] = []             # what of the cluster this machine cannot emulate faithfully

    def host_ip(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def master_addr(self) -> str:
        return self.host_ip(0)

    def placements(self) -> list[RankPlacement]:
        cgroups = [str(p) for p in self.limits.paths] if self.limits else [None] * self.cluster.world_size
        return [RankPlacement(self.hosts[self.cluster.node_of(r)], HOST_IF, cgroups[r])
                for r in range(self.cluster.world_size)]

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

        if self.cluster.uneven_compute:
            raise UserError(f"{self.cluster}: uneven compute (cpu speeds, stragglers) is emulated for autosync's own "
                            "ranks, not for torchrun jobs; drop it from the spec")
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
        self.delayed = {i for i, l in enumerate(links)
                        if self.delay_lines or (not self.netem and (l.latency_s or l.jitter_s))}
        self.beyond = beyond(self.cluster)
        if self.beyond:
            self.network = "emulated-beyond"
            log.warning("%s is beyond what this machine emulates faithfully (%s): its results are labelled "
                        "emulated-beyond", self.cluster, "; ".join(self.beyond))
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
        if self.cluster.uneven_compute:
            self.limits = CpuLimits(self.base, self.cluster)
            self.limits.create()
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "set", "lo", "up")
        _run("ip", "-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for ns in self.hosts:
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        self._start_keepers()        # the delay lines make their links' devices; the others are veth pairs
        buffers = socket_buffer_bytes(self.cluster)
        for i, ns in enumerate(self.hosts):
            port = f"p{i}"
            if i not in self.delayed:
                _run("ip", "-n", self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", HOST_IF,
                     "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.host_ip(i)}/24", "dev", HOST_IF)
            _run("ip", "-n", ns, "link", "set", HOST_IF, "up")
            for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
                _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}=4096 131072 {buffers}", check=False)
            link = self.cluster.link_of(i)
            delayed = i in self.delayed
            for where, dev in ((ns, HOST_IF), (self.switch, port)):
                for cmd in shape_commands(where, dev, link, self.netem and not delayed, whole_segments=delayed):
                    _run(*cmd)
        log.info("emulated cluster %s up as %s%s", self.cluster, self.base,
                 f" (delay lines on hosts {sorted(self.delayed)})" if self.delayed else "")

    def _start_keepers(self) -> None:
        """One delay line per host link that needs one (:mod:`autosync.executor.delayline`), or one guardian when
        none does: processes that delete this cluster if this process dies without :meth:`down`."""
        import json
        import subprocess
        import sys

        cleanup = {"namespaces": [*self.hosts, self.switch],
                   "cgroups": [str(p) for p in self.limits.paths] if self.limits else []}
        configs = []
        for i in sorted(self.delayed):
            link = self.cluster.link_of(i)
            configs.append({**cleanup, "seed": i, "links": [{
                "host_ns": self.hosts[i], "host_dev": HOST_IF, "switch_ns": self.switch, "switch_dev": f"p{i}",
                "latency_s": link.latency_s, "jitter_s": link.jitter_s}]})
        for config in configs or [cleanup]:
            self.keepers.append(subprocess.Popen(
                [sys.executable, "-m", "autosync.executor.delayline", json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True))
        for proc in self.keepers:
            ready, _, _ = select.select([proc.stdout], [], [], KEEPER_START_S)
            if not ready or proc.stdout.readline().strip() != b"ready":
                raise EmulationError(f"a delay line of {self.cluster} did not start"
                                     + (f" (exit status {proc.poll()})" if proc.poll() is not None else ""))

    def _stop_keepers(self) -> None:
        for proc in self.keepers:
            try:
                proc.stdin.write(b"down\n")
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.keepers:
            try:
                proc.wait(timeout=5)
            except Exception:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self.keepers = []

    def down(self) -> None:
        """Delete every namespace of this cluster (their veths and qdiscs go with them)."""
        if not self.up_:
            return
        self.up_ = False
        self._stop_keepers()
        for ns in [*self.hosts, self.switch]:
            _run("ip", "netns", "delete", ns, check=False)
        if self.limits is not None:
            self.limits.remove()
        atexit.unregister(self.down)
        self._restore_sigterm()

    def _trap_sigterm(self) -> None:
        """SIGTERM unwinds like Ctrl-C (`sigterm_as_interrupt`), so that ``with`` blocks tear the network down."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            self._old_sigterm = signal.signal(signal.SIGTERM, sigterm_as_interrupt)

    def _restore_sigterm(self) -> None:
        """Put back the SIGTERM handler found at `up()`, unless a SIGTERM came (then it stays ignored)."""
        if (self._old_sigterm is not None and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is sigterm_as_interrupt):
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
        log.warning("unshaped: %d ranks on this host's loopback; the links%s of %s are not applied",
                    cluster.world_size, " and compute speeds" if cluster.uneven_compute else "", cluster)
        return LocalCluster(cluster)
    ok, why = can_emulate()
    if not ok:
        raise UserError(f"cannot emulate {cluster}: {why}; {UNSHAPED_HINT}")
    return EmulatedCluster(cluster)


@contextmanager
def open_cluster(cluster: Cluster, unshaped: bool = False):
    """:func:`emulate`'s cluster, brought up (its ``pool()`` gives ranks); an emulation error (no root, no netem for
    a latency, a command that failed) is one UserError line naming the cluster."""
    try:
        with emulate(cluster, unshaped) as emu:
            yield emu
    except EmulationError as e:
        raise UserError(f"cannot emulate {cluster}: {e}") from None


@contextmanager
def open_ranks(cluster: Cluster, unshaped: bool = False, pool=None, **pool_kwargs):
    """The ranks every command measures ``cluster`` on: ``pool`` when given (the job's own in in-job mode, which
    must have the cluster's shape; or ranks the caller keeps), else the cluster emulated on this machine, or,
    asked for, unshaped loopback (:func:`open_cluster`); ``pool_kwargs`` go to its ``pool()``. The one way
    commands open ranks."""
    if pool is not None:
        if getattr(pool, "in_job", False):
            from autosync.executor.job import check_shape

            check_shape(cluster, pool)
        yield pool
        return
    with open_cluster(cluster, unshaped) as emu, emu.pool(**pool_kwargs) as ranks:   # its errors: open_cluster's
        yield ranks
