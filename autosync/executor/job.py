"""In-job mode: the ranks of the user's own distributed job (torchrun, SLURM, any env:// launcher).

``torchrun ... -m autosync.cli tune --in-job ...`` starts the command on every rank of the
job. Rank 0 runs autosync's loop exactly as it runs against local ranks and owns every
file (the Optuna study, the cost model, the dataset, the profile, the strategy file); every
other rank serves it (:meth:`JobPool.serve`). :class:`JobPool` has the interface of
:class:`~autosync.executor.launch.RankPool` (``run(fn, *args, timeout=s)`` calls
``fn(ctx, *args)`` on every rank and returns the per-rank results), so nothing above the
executor knows which ranks it measures on. Each trial builds its model and its DDP wrap
afresh (a comm hook can be registered once per wrap).

**Groups.** Tasks and results travel as pickled objects on a gloo *control* group (host
memory, also when the job computes on GPUs with NCCL) whose timeout is long: followers wait
there while rank 0 thinks. A task's own collectives run on the job's main group, NCCL for
CUDA and gloo for the CPU (:mod:`autosync.executor.device`), whose timeout is the trial limit.

**Topology.** Hosts are the launcher's node ranks (``GROUP_RANK`` under torchrun,
``SLURM_NODEID`` under srun, else the hostname: emulated hosts share one hostname, so
torchrun's node rank comes first). Every host must hold the same number of consecutive
ranks; a job that does not is refused in one line.

**Failures.** A task that raises on a rank, or outlives its limit, leaves the main group in
an unknown state (a peer may still be inside a collective), so the job does not go on with
it. A raised error comes back to rank 0's caller as :class:`TrialFailure` (and is recorded
with its reason); the next task then ends the job with exit status :data:`RESTART_EXIT` on
every rank, so that ``torchrun --max-restarts`` starts it again with a fresh process group
and the loop resumes from what it stored. A task past its limit is ended by a watchdog on
every rank (rank 0 first writes the reason through :attr:`JobPool.on_abort`). A rank killed
outright takes the job down with it (torchrun stops the others); the trial it was in is
found started-but-unfinished when the job restarts and is stored as failed
(:class:`autosync.search.trials.Journal`).
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
import threading
import traceback
from typing import Any, Callable

from autosync.errors import UserError
from autosync.executor.launch import RankContext, TrialFailure

log = logging.getLogger(__name__)
RESTART_EXIT = 75            # EX_TEMPFAIL: "start me again"; torchrun restarts on any non-zero status
CONTROL_TIMEOUT_S = 7 * 24 * 3600
GRACE_S = 15.0               # a task's watchdog fires this long after its limit (the limit covers the collectives)


class JobRestart(SystemExit):
    """Ends the job so that its launcher starts it again (exit status RESTART_EXIT)."""

    def __init__(self, why: str):
        super().__init__(RESTART_EXIT)
        self.why = why


def check_shape(cluster, pool) -> None:
    """UserError unless ``cluster`` (a Cluster) has the job's shape: hosts x ranks per host."""
    if (cluster.nodes, cluster.ranks_per_node) != (pool.hosts, pool.ranks_per_host):
        raise UserError(f"--cluster {cluster} says {cluster.nodes} host(s) x {cluster.ranks_per_node} rank(s), but "
                        f"this job has {pool.hosts} host(s) x {pool.ranks_per_host} rank(s); give the job's shape "
                        f"(its links' speed is nominal: the network is measured in the job)")


def host_key() -> str:
    """What tells this rank's host from the others: the launcher's node rank, else the hostname."""
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if os.environ.get(var, "").strip():
            return f"node{os.environ[var].strip()}"
    return socket.gethostname()


def ranks_per_host(keys: list[str]) -> int:
    """Ranks per host from every rank's host key (in rank order); UserError unless uniform and consecutive."""
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    sizes = sorted(set(counts.values()))
    rph = sizes[0]
    blocks = [keys[i:i + rph] for i in range(0, len(keys), rph)]
    if len(sizes) > 1 or any(len(set(b)) != 1 for b in blocks):
        per = ", ".join(f"{k}: {n}" for k, n in counts.items())
        raise UserError(f"the job's hosts are not uniform ({per} ranks, in rank order {keys}); autosync needs the "
                        f"same number of consecutive ranks on every host (torchrun --nproc-per-node G on every node)")
    return rph


def _attempt_store(timeout_s: float):
    """The job's rendezvous store (torch's env:// one), with this start's keys under a prefix of their own.

    Under torchrun the workers share the agent's store across restarts, and torch's env:// rendezvous
    adds no prefix per start (measured: a key set before a restart is still there after it). A
    restarted rank may then read a dead rank's gloo address from the last start before the new one
    overwrites it, and fail to connect (seen here under load). torchrun's restart count cannot name
    the start: it is per node, and a node restarted for a membership change does not count it. So
    rank 0 names it (:func:`_agree_on_start`).
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=max(timeout_s, 300))
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    start = _agree_on_start(store, rank, world, timeout.total_seconds())
    os.environ["AUTOSYNC_JOB_START"] = start   # recorded in the profile's environment
    return dist.PrefixStore(f"autosync/{start}", store)


def _agree_on_start(store, rank: int, world: int, timeout_s: float) -> str:
    """A name for this start of the job, the same on every rank and new at every start.

    Rank 0 draws a nonce N, publishes it, waits until every rank has acknowledged N, then tells each
    rank ``go`` under a key of N and that rank's own, which the rank deletes once read. A rank that
    read a stale nonce (the last start's) acknowledges it, finds no ``go`` for it within a second (the
    last start's ``go`` keys were consumed), reads the nonce again and acknowledges the new one. A rank
    killed between rank 0's ``go`` and its read leaves one stale ``go``: the next start may then
    disagree once, time out, and the start after it agrees (the stale key is consumed on the way).
    """
    import secrets
    import time

    deadline = time.monotonic() + timeout_s
    if rank == 0:
        nonce = secrets.token_hex(8)
        store.set("autosync/start", nonce)
        waiting = set(range(1, world))
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(waiting)} did not join this start of the job")
            for r in list(waiting):
                if store.check([f"autosync/ack/{r}"]) and store.get(f"autosync/ack/{r}").decode() == nonce:
                    waiting.discard(r)
            time.sleep(0.05)
        for r in range(1, world):
            store.set(f"autosync/go/{nonce}/{r}", "1")
        return nonce
    while time.monotonic() < deadline:
        nonce = store.get("autosync/start").decode()      # blocks until rank 0 of some start wrote it
        store.set(f"autosync/ack/{rank}", nonce)
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            key = f"autosync/go/{nonce}/{rank}"
            if store.check([key]):
                store.delete_key(key)
                return nonce
            time.sleep(0.05)
    raise TimeoutError("rank 0 did not start this start of the job")


def leave() -> None:
    """Take this process's process groups down now, while the interpreter is whole.

    A group destroyed only at interpreter exit can abort the process: gloo's worker threads may still
    hold work whose tensors need the GIL while Python is being torn down ("terminate called without an
    active exception", SIGABRT, seen here twice after rank 0 had written its strategy file; torch's
    own fix, an atexit hook, was abandoned: pytorch/pytorch#179291). ``destroy_process_group`` drops
    torch's references; the caller drops its own (the pool's control group) and ``gc.collect`` frees
    any held in cycles, so the groups' C++ objects go now.
    """
    import gc

    import torch.distributed as dist

    from autosync.executor.hooks import drop_retired

    drop_retired()
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a job whose peers are gone already: nothing left to tear down cleanly
        pass
    gc.collect()


class JobPool:
    """The job's ranks, driven by rank 0. Build it on every rank (it initializes the process group)."""

    network = "real"
    in_job = True    # trials are journaled, a failure ends the job (see the module's docstring)

    def __init__(self, timeout_s: float = 300.0, backend: str | None = None):
        import torch.distributed as dist

        from autosync.executor import device as dev

        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise UserError(f"--in-job runs inside a distributed job, and ${var} is not set: start it with "
                                f"torchrun (e.g. torchrun --nnodes N --nproc-per-node G -m autosync.cli ... --in-job)")
        try:
            self.device = dev.default_device()
            dev.set_device(self.device)
            self.backend = backend or dev.backend_for(self.device)
            self.timeout_s = timeout_s
            if not dist.is_initialized():
                dist.init_process_group(self.backend, store=_attempt_store(timeout_s),
                                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                        timeout=datetime.timedelta(seconds=timeout_s))
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=CONTROL_TIMEOUT_S))
            keys: list[Any] = [None] * self.world_size
            dist.all_gather_object(keys, host_key(), group=self.control)
            self.ranks_per_host = ranks_per_host(keys)
            self.hosts = self.world_size // self.ranks_per_host
            self.facts = {**dev.describe(self.device), "hosts": self.hosts, "ranks_per_host": self.ranks_per_host,
                          "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                          "start": os.environ.get("AUTOSYNC_JOB_START", "")}
            self.ctx = RankContext(self.rank, self.world_size, self.ranks_per_host, device=self.device,
                                   backend=self.backend)
            self.broken: str | None = None
            self._released = False
            self.on_abort: Callable[[str, str], None] | None = None   # rank 0: (status, reason) before a watchdog exit
            self.starts = 1
        except BaseException:
            self.__dict__.pop("control", None)
            leave()      # joined (part of) the job and cannot go on: take its groups down now
            raise

    # --- RankPool's interface -------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.broken is None

    def start(self) -> None:
        """After a failed task, end the job so that its launcher starts it afresh (RankPool.start restarts ranks)."""
        if self.broken:
            self._end(self.broken)

    def kill(self) -> None:
        """Nothing to kill from inside: a failed job ends itself (see the module's docstring)."""

    def __enter__(self) -> "JobPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, fn: Callable, *args: Any, timeout: float = 300.0) -> list[Any]:
        """Rank 0: run ``fn(ctx, *args)`` on every rank of the job; the per-rank results, or TrialFailure."""
        import torch.distributed as dist

        if self.rank != 0:
            raise RuntimeError("JobPool.run is rank 0's; the other ranks serve()")
        if self.broken:
            self._end(self.broken)
        dist.broadcast_object_list([("task", fn, args, timeout)], src=0, group=self.control)
        mine = self._call(fn, args, timeout)
        results: list[Any] = [None] * self.world_size
        try:
            dist.gather_object(mine, results, dst=0, group=self.control)
        except Exception as e:  # noqa: BLE001 - a peer died: the launcher is stopping the job
            self.broken = f"a rank left the job ({type(e).__name__}: {e})"
            raise TrialFailure("failed", self.broken[:500]) from None
        errors = [r[1] for r in results if r[0] == "error"]
        if errors:
            self.broken = errors[0]
            raise TrialFailure("failed", "; ".join(errors)[:500])
        return [r[1] for r in results]

    def close(self) -> None:
        """Every rank, when done with the job: rank 0 releases the other ranks (they return from :meth:`serve`),
        once; then this process's process groups are taken down (:func:`leave`)."""
        import torch.distributed as dist

        if self.rank == 0 and not self._released:
            self._released = True
            try:
                dist.broadcast_object_list([("done",)], src=0, group=self.control)
            except Exception:  # noqa: BLE001 - the others are gone already
                pass
        self.control = None
        leave()

    # --- the other ranks ---------------------------------------------------------------------------
    def serve(self) -> int:
        """Ranks other than 0: run rank 0's tasks until it is done; the exit status for the process."""
        import torch.distributed as dist

        while True:
            box: list[Any] = [None]
            try:
                dist.broadcast_object_list(box, src=0, group=self.control)
            except Exception as e:  # noqa: BLE001 - rank 0 is gone: the launcher restarts the job
                print(f"autosync: rank {self.rank}: rank 0 left the job ({type(e).__name__}); ending this rank",
                      file=sys.stderr, flush=True)
                return RESTART_EXIT
            msg = box[0]
            if msg[0] == "done":
                return 0
            if msg[0] == "restart":
                log.warning("rank %d: %s", self.rank, msg[1])
                return RESTART_EXIT
            _, fn, args, timeout = msg
            try:
                dist.gather_object(self._call(fn, args, timeout), None, dst=0, group=self.control)
            except Exception as e:  # noqa: BLE001 - as above
                print(f"autosync: rank {self.rank}: rank 0 left the job ({type(e).__name__}); ending this rank",
                      file=sys.stderr, flush=True)
                return RESTART_EXIT

    # --- both ---------------------------------------------------------------------------------------
    def _call(self, fn: Callable, args: tuple, timeout: float) -> tuple[str, Any]:
        def overdue() -> None:
            why = f"ranks did not finish within {timeout:.0f} s (rank {self.rank}'s watchdog ended the job)"
            print(f"autosync: {why}", file=sys.stderr, flush=True)
            if self.on_abort is not None:
                try:
                    self.on_abort("timeout", why)
                except Exception:  # noqa: BLE001 - exiting anyway
                    pass
            os._exit(RESTART_EXIT)

        watchdog = threading.Timer(timeout + GRACE_S, overdue)
        watchdog.daemon = True
        watchdog.start()
        try:
            return ("ok", fn(self.ctx, *args))
        except Exception as e:  # noqa: BLE001 - reported to rank 0
            log.debug("rank %d task failed:\n%s", self.rank, traceback.format_exc())
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return ("error", f"rank {self.rank}: {type(e).__name__}: {first}"[:500])
        finally:
            watchdog.cancel()

    def _end(self, why: str) -> None:
        """Rank 0: end the job on every rank so that the launcher restarts it."""
        import torch.distributed as dist

        msg = (f"a trial failed inside the job ({why[:200]}); ending the job so that torchrun starts it again "
               f"with a fresh process group (it resumes from what is stored)")
        print(f"autosync: {msg}", file=sys.stderr, flush=True)
        self._released = True
        try:
            dist.broadcast_object_list([("restart", msg)], src=0, group=self.control)
        except Exception:  # noqa: BLE001 - the others are gone already
            pass
        raise JobRestart(msg)
