"""Rank processes: a pool of local ranks kept alive across trials, and torchrun detection.

A :class:`RankPool` spawns ``world_size`` processes that join one process group (gloo on
CPU tensors by default; ``backend``/``device`` make them NCCL or gloo on CUDA, as the GPU
check does) and then wait for tasks. ``pool.run(fn, *args, timeout=s)`` calls ``fn(ctx, *args)`` on every
rank and returns the per-rank results; if any rank raises, dies or the time limit runs
out, every rank is killed (SIGKILL to its whole process group) and :class:`TrialFailure`
says why. The next ``run`` starts fresh ranks. Rank processes die with the launcher (a thread
in each waits on the launcher's pidfd), so nothing outlives a crashed or killed launcher; the
folder of a killed launcher's rank outputs (``autosync-ranks-<pid>@<host>-*`` in the temp dir) is
removed by the next pool that starts there.

Ranks start from multiprocessing's *forkserver* (spawn where there is none): a server process
imports torch once (and ``torch._dynamo``, which every optimizer needs), and each rank is a fork of it, so a
pool start costs a fork instead of an interpreter and a torch import per rank. Each rank still gets the launcher's environment,
working directory and ``sys.path`` as of ``start()`` and re-imports the main module (as under
spawn); torch is imported in the server, never initialized there (no CUDA, no threads).

Each rank may enter a network namespace first and bind gloo to one interface: that is how
the emulated cluster (:mod:`autosync.executor.emulate`) places ranks on hosts.
"""
from __future__ import annotations

import atexit
import ctypes
import faulthandler
import logging
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import socket
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
#: what the forkserver imports once for every rank it forks. ``torch._dynamo``: torch's optimizers import it on their
#: first construction (``torch._disable_dynamo``), 1.5 s of CPU per rank here, paid by every trial's ranks otherwise;
#: last, :mod:`autosync.executor._frozen` freezes the server's objects so that the ranks' collections leave them
#: (and the pages they share with the server) alone (bench/pool_start.py)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "autosync.executor._frozen"]
STARTED = "started"                        # a rank's marker file: it reached _rank_main
RANKS_DIR = "autosync-ranks-"              # + "<launcher pid>@<host>-": a pool's folder of rank outputs (temp dir)
_live_pools: "weakref.WeakSet[RankPool]" = weakref.WeakSet()


class TrialFailure(Exception):
    """A task that did not finish on every rank: ``status`` is 'failed' or 'timeout'."""

    def __init__(self, status: str, reason: str):
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class RankPlacement:
    """Where a rank runs: its network namespace, the interface gloo binds to and its CPU cgroup (None = here)."""

    netns: str | None = None
    ifname: str | None = None
    cgroup: str | None = None


@dataclass
class RankContext:
    """What a task sees on its rank."""

    rank: int
    world_size: int
    ranks_per_host: int
    extra: dict = field(default_factory=dict)
    device: str = "cpu"          # where this rank computes (executor.device): cpu, or cuda:<local rank>
    backend: str = "gloo"
    #: the emulated host's interface to the other hosts (inside this rank's namespace), None elsewhere: what the
    #: host sends to other hosts crosses it and nothing else does, so its counters measure the bytes sent
    host_if: str | None = None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_rank_dirs() -> list[str]:
    """Remove the rank-output folders whose launcher, on this host, is gone (SIGKILLed: it could not remove its
    own). A folder of another host (a temp dir shared between containers) is left alone."""
    removed = []
    with os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            pid, _, rest = entry.name[len(RANKS_DIR):].partition("@")
            mine = entry.name.startswith(RANKS_DIR) and rest.rsplit("-", 1)[0] == socket.gethostname()
            if mine and pid.isdigit() and not pid_alive(int(pid)) and entry.is_dir():
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def start_method() -> str:
    """'forkserver' where this platform has it, else 'spawn'."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _die_with(launcher: int) -> None:
    """SIGKILL this rank's process group when the launcher process exits, however it exits. A forked rank's
    parent is the forkserver, not the launcher, so PR_SET_PDEATHSIG alone would not see the launcher go."""
    import threading

    def watch() -> None:
        try:
            fd = os.pidfd_open(launcher)
        except (AttributeError, OSError):     # no pidfd (old kernel): poll
            fd = None
        if fd is not None:
            import select

            select.select([fd], [], [])
        else:
            while True:
                try:
                    os.kill(launcher, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="autosync-launcher-watch", daemon=True).start()


def _rank_main(rank: int, world: int, ranks_per_host: int, master: tuple[str, int], place: RankPlacement,
               threads: int, tasks: mp.Queue, results: mp.Queue, backend: str = "gloo",
               device: str = "cpu", stderr_dir: str | None = None, env: dict | None = None,
               launcher: int | None = None) -> None:
    if stderr_dir:   # a forked rank's fd 2 is the forkserver's: its own file from here on
        fd = os.open(os.path.join(stderr_dir, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        open(os.path.join(stderr_dir, f"rank{rank}.{STARTED}"), "w").close()
    # A fatal signal (SIGABRT from a C++ exception nobody caught, SIGSEGV) writes every thread's Python stack
    # to the rank's stderr: the death's reason names where it died (see _last_words).
    faulthandler.enable(all_threads=True)
    if env is not None:   # the launcher's environment at start(), not the forkserver's
        os.environ.clear()
        os.environ.update(env)
    os.setsid()  # own process group: the launcher kills it whole; Ctrl-C goes to the launcher only
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if launcher is not None:
        _die_with(launcher)
    try:
        if place.cgroup:   # before torch starts its threads, which then live under the same limit
            with open(os.path.join(place.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if place.netns:
            _enter_netns(place.netns)
        if place.ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = place.ifname
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(ranks_per_host),
                          LOCAL_RANK=str(rank % ranks_per_host))
        import torch
        import torch.distributed as dist

        from autosync.executor.device import set_device

        torch.set_num_threads(threads)
        if device == "cuda":   # one GPU per rank where there are enough, else ranks share them (gloo only)
            device = f"cuda:{rank % max(1, torch.cuda.device_count())}"
        set_device(device)
        # torch's own timeout for the group's operations (gloo 30 min): the launcher bounds the start (start_timeout)
        # and each task (its timeout) itself. The start limit as the operation timeout failed every collective that
        # waited 2 min on a slower rank: asp's rank 0, done with its first window long before the workers that
        # exchange with it over a slow link, timed out in the window's all-reduce (moe-tiny, 3x1@200mbit).
        dist.init_process_group(backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world)
        ctx = RankContext(rank, world, ranks_per_host, device=device, backend=backend,
                          host_if=place.ifname if place.netns else None)
        results.put(("ready", rank, None))
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        results.put(("error", rank, f"rank {rank} could not start: {type(e).__name__}: {e}"))
        return
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            results.put(("ok", rank, fn(ctx, *args)))
        except BaseException as e:  # noqa: BLE001 - reported to the launcher
            log.debug("rank %d task failed:\n%s", rank, traceback.format_exc())
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            results.put(("error", rank, f"rank {rank}: {type(e).__name__}: {first}"[:500]))
    from autosync.executor.hooks import drop_retired

    drop_retired()
    dist.destroy_process_group()


START_TIMEOUT_S = 120.0   # how long ranks may take to start (import torch, join the group) by default


class RankPool:
    """``world_size`` gloo ranks that stay alive across tasks. Use as a context manager."""

    in_job = False   # ranks this process started (a JobPool is the job's own ranks: failures end the job)

    def __init__(self, world_size: int, ranks_per_host: int | None = None,
                 placements: list[RankPlacement] | None = None, master_addr: str = "127.0.0.1",
                 threads_per_rank: int | None = None, start_timeout: float = START_TIMEOUT_S,
                 network: str = "unshaped",
                 backend: str = "gloo", device: str = "cpu", method: str | None = None):
        self.world_size = world_size
        self.network = network          # what the ranks' links are: unshaped loopback, emulated, or real (Context)
        self.backend, self.device = backend, device   # device "cuda": rank r computes on GPU r % count
        self.ranks_per_host = ranks_per_host or world_size
        self.placements = placements or [RankPlacement()] * world_size
        self.master_addr = master_addr
        self.threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
        self.start_timeout = start_timeout
        self._ctx = mp.get_context(method or start_method())   # method: 'forkserver' or 'spawn' (a benchmark's)
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(PRELOAD)
        self._procs: list[mp.Process] = []
        self._tasks: list[mp.Queue] = []
        self._results: mp.Queue | None = None
        self.starts = 0
        self._stderr_dir: str | None = None
        _live_pools.add(self)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> None:
        began = time.monotonic()    # the limit covers p.start() too: the first waits while the forkserver imports torch
        self.kill()
        self._results = self._ctx.Queue()
        self._tasks = [self._ctx.Queue() for _ in range(self.world_size)]
        master = (self.master_addr, free_port())
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # ranks inherit it: c10d warns on reverse DNS of 198.18.x
        sweep_rank_dirs()
        self._stderr_dir = tempfile.mkdtemp(prefix=f"{RANKS_DIR}{os.getpid()}@{socket.gethostname()}-")
        env = dict(os.environ)
        self._procs = [self._ctx.Process(
            target=_rank_main, name=f"autosync-rank{r}", daemon=True,
            args=(r, self.world_size, self.ranks_per_host, master, self.placements[r], self.threads,
                  self._tasks[r], self._results, self.backend, self.device, self._stderr_dir,
                  env, os.getpid()))
            for r in range(self.world_size)]
        forked = self._ctx.get_start_method() == "forkserver"
        for r, p in enumerate(self._procs):
            if forked:    # the rank opens its file itself; the server keeps this process's stderr
                p.start()
                continue
            # A spawned rank's fd 2 is its file from its first instruction on (inherited at start), so that a rank
            # that dies in the spawn bootstrap, before _rank_main runs, leaves its last words for the reason.
            fd = os.open(os.path.join(self._stderr_dir, f"rank{r}.stderr"), os.O_WRONLY | os.O_CREAT, 0o600)
            saved = os.dup(2)
            try:
                os.dup2(fd, 2)
                p.start()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
        self.starts += 1
        self._collect("ready", self.start_timeout, began)

    def kill(self) -> None:
        """SIGKILL every rank (and anything it started), then reap them."""
        for p in self._procs:
            if p.pid is not None and p.is_alive():
                for target in (lambda: os.killpg(p.pid, signal.SIGKILL), lambda: os.kill(p.pid, signal.SIGKILL)):
                    try:
                        target()
                    except (ProcessLookupError, PermissionError):
                        pass
        for p in self._procs:
            if p.pid is not None:       # a process that never started (its start raised) cannot be joined
                p.join(timeout=5)
        for q in [*self._tasks, *([self._results] if self._results else [])]:
            q.cancel_join_thread()
            q.close()
        self._procs, self._tasks, self._results = [], [], None
        if self._stderr_dir:
            shutil.rmtree(self._stderr_dir, ignore_errors=True)
            self._stderr_dir = None

    def stderr_text(self, rank: int, limit: int = 8192) -> str:
        """The last ``limit`` bytes a rank wrote to its stderr, '' when none."""
        try:
            with open(os.path.join(self._stderr_dir or "", f"rank{rank}.stderr"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _deaths(self, dead: list[tuple[int, int | None]], lines: int = 6, chars: int = 300) -> str:
        """'rank R died (how): its last stderr lines' for each dead rank, with the one cause we can name."""
        parts = []
        for r, code in dead:
            text = self.stderr_text(r)
            tail = _last_words(text, lines, chars)
            started = os.path.exists(os.path.join(self._stderr_dir or "", f"rank{r}.{STARTED}"))
            if "bootstrapping phase" in text or not started:
                where = "" if started or text else " (its traceback is on this process's stderr)"
                parts.append(f"rank {r} died ({_describe_exit(code)}) before autosync started in it{where}: "
                             f"{BOOTSTRAP_HINT}")
            else:
                parts.append(f"rank {r} died ({_describe_exit(code)})" + (f": {tail}" if tail else ""))
        return "; ".join(parts)

    def close(self) -> None:
        """Ask the ranks to leave the process group and exit; kill those that do not."""
        for q in self._tasks:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + 10
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # Unwinding from an exception (Ctrl-C, SIGTERM, an error mid-task) the ranks may be inside a task and never
        # read the request to leave: close() would wait its 10 s for nothing, so they are killed at once.
        self.kill() if exc_type is not None else self.close()

    # --- tasks -------------------------------------------------------------------------------
    def run(self, fn: Callable, *args: Any, timeout: float = 300.0) -> list[Any]:
        """Run ``fn(ctx, *args)`` on every rank; the per-rank results, or TrialFailure."""
        if not self.alive:
            self.start()
        for q in self._tasks:
            q.put((fn, args))
        return self._collect("ok", timeout)

    def _collect(self, want: str, timeout: float, began: float | None = None) -> list[Any]:
        """Every rank's ``want`` message within ``timeout`` s of ``began`` (default: now); a rank that dies first
        fails the collection, and so does a start ("ready") that came in after its limit."""
        out: dict[int, Any] = {}
        began = time.monotonic() if began is None else began
        deadline = began + timeout
        while len(out) < self.world_size:
            try:
                kind, rank, payload = self._results.get(timeout=0.1)  # type: ignore[union-attr]
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    reason = self._deaths(dead)
                    self.kill()
                    raise TrialFailure("failed", reason[:500])
                if time.monotonic() > deadline:
                    self.kill()
                    what = "start" if want == "ready" else "finish"
                    missing = sorted(set(range(self.world_size)) - set(out))
                    raise TrialFailure("timeout", f"ranks {missing} did not {what} within {timeout:g} s")
                continue
            if kind == "error":
                # A peer's crash shows up first as a socket error on the other ranks: give the
                # crashed rank a moment to be seen dead, and name it as the cause.
                time.sleep(0.5)
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                deaths = self._deaths([(r, c) for r, c in dead if c])
                self.kill()
                if deaths:
                    raise TrialFailure("failed", f"{deaths}; then {payload}"[:500])
                raise TrialFailure("failed", payload)
            out[rank] = payload
        if want == "ready" and time.monotonic() > deadline:    # started, but later than the limit allows
            self.kill()
            raise TrialFailure("timeout", f"ranks did not start within {timeout:g} s "
                                          f"(they took {time.monotonic() - began:.1f} s)")
        return [out[r] for r in range(self.world_size)]


BOOTSTRAP_HINT = ("most often the script started autosync while being imported: rank processes re-import "
                  "the main module, so call autosync.tune (or anything that starts ranks) under "
                  "`if __name__ == '__main__':`")


def _last_words(text: str, lines: int = 6, chars: int = 300) -> str:
    """A dead rank's stderr in one line: its last ``lines`` lines; after a fatal signal (faulthandler's dump),
    the lines written just before the dump (the C++ runtime's, e.g. "terminate called after throwing an
    instance of ..." and its "what():") and the innermost Python frame of the thread that died."""
    def join(xs: list[str]) -> str:
        return " | ".join(x.strip() for x in xs if x.strip())

    before, fatal, dump = text.partition("Fatal Python error")
    if not fatal:
        return join(text.strip().splitlines()[-lines:])[-chars:]
    frame = re.search(r"Current thread [^\n]*\n\s*([^\n]+)", dump)
    where = re.sub(r'File "(?:[^"]*/)?([^"/]+)"', r"\1", frame.group(1).strip()) if frame else "no Python frame"
    return f"{join(before.strip().splitlines()[-3:])[-chars:]} | {fatal}{dump.splitlines()[0]} in {where}".lstrip(" |")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def in_torchrun() -> bool:
    """True inside a torchrun (or any env:// launcher) job."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


@atexit.register
def _kill_live_pools() -> None:
    for pool in list(_live_pools):
        pool.kill()
