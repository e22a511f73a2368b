"""Context: where a measurement comes from. One value, one id, built here and nowhere else.

A context is the workload, its per-rank batch, the cluster spec, and the environment
really used to measure: the network (``emulated`` = namespaces and tc shaped as the spec
says; ``unshaped`` = local loopback, the spec's links *not* applied; ``real`` = the job's
own cluster; ``nominal`` = nothing measured, the spec's numbers; ``emulated-beyond`` = emulated,
but beyond what this machine emulates faithfully: :mod:`autosync.executor.fidelity`), the backend and the
device. Rows of one context are comparable with each other and with nothing else: the id
keys profiles, dataset rows, Optuna studies and benchmark rows.

The id of an emulated gloo/CPU context is ``workload|b<batch>|<spec>`` (the form of the
shipped dataset); any other environment appends ``|<network>|<backend>|<device>``, so an
unshaped or GPU measurement can never be filed under a shaped CPU one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autosync.strategy import Strategy

NETWORKS = ("emulated", "unshaped", "real", "nominal", "emulated-beyond")
DEFAULT_ENV = ("emulated", "gloo", "cpu")


def workload_batch(workload: str, batch_size: int) -> str:
    """The ``workload|b<batch>`` prefix every key of autosync starts with (contexts, efficiency keys)."""
    return f"{workload}|b{batch_size}"


def device_kind(device) -> str:
    """``cuda`` or ``cpu``: what a Context records of a device (``cuda:1`` is ``cuda``)."""
    return "cuda" if str(device).startswith("cuda") else "cpu"


@dataclass(frozen=True)
class Context:
    workload: str
    batch_size: int
    cluster: str                 # the cluster spec, canonical form (Cluster.spec())
    network: str = "emulated"    # one of NETWORKS
    backend: str = "gloo"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(f"network {self.network!r} is not one of {', '.join(NETWORKS)}")

    @property
    def id(self) -> str:
        base = f"{workload_batch(self.workload, self.batch_size)}|{self.cluster}"
        env = (self.network, self.backend, self.device)
        return base if env == DEFAULT_ENV else f"{base}|{'|'.join(env)}"

    @property
    def shaped(self) -> bool:
        """Whether the measured links are those of the spec (emulated as it says, or the real cluster)."""
        return self.network in ("emulated", "real", "emulated-beyond")

    @property
    def label(self) -> str:
        """How tables and files name where the numbers come from."""
        if self.network == "emulated":
            return f"{self.cluster} (emulated, {self.backend}/{self.device})"
        if self.network == "emulated-beyond":
            return f"{self.cluster} (emulated BEYOND this machine's faithful range, {self.backend}/{self.device})"
        if self.network == "unshaped":
            return f"unshaped loopback ({self.cluster}'s links NOT applied, {self.backend}/{self.device})"
        if self.network == "real":
            return f"{self.cluster} (real cluster, {self.backend}/{self.device})"
        return f"{self.cluster} (nominal: not measured)"

    @classmethod
    def of(cls, workload, batch_size: int, cluster, network: str = "emulated", backend: str = "gloo",
           device: str = "cpu") -> "Context":
        """From a workload (name or object), a batch size and a Cluster (or its spec)."""
        spec = cluster.spec() if hasattr(cluster, "spec") else str(cluster)
        return cls(str(workload), int(batch_size), spec, network, backend, device)

    @classmethod
    def on(cls, pool, workload, batch_size: int, cluster) -> "Context":
        """The context a rank pool (local, emulated or a job's own ranks) measures in."""
        return cls.of(workload, batch_size, cluster, pool.network, getattr(pool, "backend", "gloo"),
                      device_kind(getattr(pool, "device", "cpu")))


#: where a timing-dependent efficiency was measured when not on a cluster
LOOPBACK = "loopback"


def efficiency_key(workload: str, batch_size: int, world: int, ranks_per_host: int, strategy: "Strategy",
                   cluster: str | None = None) -> str:
    """Where one efficiency measurement (:mod:`autosync.efficiency`) applies: workload, batch, world (and hosts,
    for a mode that uses them) and the strategy's lossy choices. The network does not enter for a synchronous
    mode: its math does not depend on it. An asynchronous mode's (asp) does: its staleness follows the ranks'
    relative speeds and the links, so its key also names where it was measured (``|on:<cluster spec>``, or
    ``|on:loopback`` when it was trained on unshaped loopback ranks)."""
    hosts = f"x{ranks_per_host}" if strategy.sync.kind.needs_hosts else ""
    where = f"|on:{cluster or LOOPBACK}" if strategy.sync.kind.asynchronous else ""
    return f"{workload_batch(workload, batch_size)}|w{world}{hosts}|{strategy.lossy_key()}{where}"


def reference_key(workload: str, batch_size: int, world: int, seed: int) -> str:
    """The efficiency key of the DDP default's reference run from ``seed``."""
    return f"{workload_batch(workload, batch_size)}|w{world}|reference|seed{seed}"


def efficiency_place(ekey: str) -> str | None:
    """Where the row of efficiency key ``ekey`` was measured, as :func:`efficiency_key` wrote it: a cluster's
    spec or ``loopback`` for an asynchronous mode, None for any other (measured anywhere alike)."""
    _, sep, where = ekey.rpartition("|on:")
    return where if sep else None
