"""One DDP communication hook that carries out every group's plan.

DDP hands the hook a *bucket*: a flat buffer holding the gradients of several parameters,
laid end to end in ``bucket.parameters()`` order. The hook cuts the buffer into
*segments*, maximal runs of parameters that belong to the same strategy group, and hands
each segment's view of the buffer to its group's compressor, which averages it in place
using the group's plan to sum over ranks. With ``W`` ranks and local gradient ``g_r`` on
rank ``r``, every lossless combination leaves ``(1/W) * sum_r g_r`` in the buffer on every
rank. What each plan, compressor and sync mode does (and costs) is written once, in its
module of the registry :mod:`autosync.plans`; this module only cuts buckets and runs them.

Segments run one after another on a single worker thread per rank, so every rank issues
the same collectives in the same order while backward goes on (overlap). When every group
is a plan with a fast path (plain all-reduce, uncompressed), the hook issues one
asynchronous all-reduce per bucket instead, like DDP's own ``allreduce_hook``, and chains
its result from the collective's own future.

Delayed modes (``ssp``, :meth:`~autosync.plans.base.SyncModeDef.delay` ``s > 0``): the hook
copies the bucket, starts its average by the same path (fast path or worker) and hands DDP,
at once, the average of the same parameters' gradients of ``s`` steps ago (zeros for the first
``s`` steps). Averages in flight are kept per step and per parameter, so DDP's rebuilding of
its buckets after the first step does not mix them up.

Devices: every temporary a plan makes lives on the bucket's device. On CUDA the worker
thread makes the bucket's device current and issues its kernels on the stream that was
current when DDP called the hook (the stream backward wrote the bucket on), so they are
ordered after the gradients they read; the future handed back to DDP is created with the
bucket's device, so it records an event on that stream when it is set and DDP's waiting
stream waits for it (no host synchronization, no cross-stream hazard).
"""
# No "from __future__ import annotations": DDP checks the hook's annotations at run time.

import atexit
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autosync import plans as registry
from autosync.strategy import Strategy

log = logging.getLogger(__name__)

# Process groups destroyed by the last close(), kept until the next close() (or exit) drops them on this thread.
_RETIRED: list = []
# whether this process built a hook's state (joined a group through autosync): only such a process collects at exit
_BUILT = False


def retire(*groups) -> None:
    """Hold destroyed groups' Python handles until the next :meth:`SyncState.close` or exit.

    A comm hook's ``then`` callbacks run on gloo's worker threads and keep the hook state alive until they return.
    Were the last reference to a group dropped there, ``~ProcessGroupGloo`` would join its own worker thread:
    ``std::system_error: Resource deadlock avoided``, SIGABRT (seen in CI, rank 0 of a tune test).
    Held here, a group dies on the thread that closes the next strategy, long after its callbacks ended."""
    _RETIRED.extend(g for g in groups if g is not None)


def drop_retired() -> None:
    """Drop the retired groups now (a thread that no gloo callback runs on: close(), a rank's exit, atexit)."""
    _RETIRED.clear()


def _at_exit() -> None:
    """At exit, while the interpreter is whole: drop the retired groups and collect the cycles that still hold one.

    A process group whose last reference goes during the interpreter's teardown can abort the process ("terminate
    called without an active exception", SIGABRT): gloo's worker threads may hold work whose tensors need the GIL
    (pytorch/pytorch#179291). ``destroy_process_group`` drops torch's own references, but a DDP model the script
    no longer reaches (its ``main`` has returned) keeps its reducer, and the reducer its group, until a collection
    that may only come at teardown (seen once in CI: rank 1 of the Accelerate example, after ``end_training``).
    A process that never built a hook's state (a CLI that only predicts, a launcher) holds no such group and skips
    the collection (0.07 s in a process with torch and the CLI loaded)."""
    drop_retired()
    if _BUILT:
        import gc

        gc.collect()


atexit.register(_at_exit)


@dataclass(frozen=True)
class Segment:
    """A run of parameters of one group inside a bucket: buffer[start:end]."""

    group: int
    start: int
    end: int
    shapes: tuple[tuple[int, int, torch.Size], ...]  # (offset within segment, numel, shape) per parameter
    key: tuple[int, ...]                               # id() of each parameter: stable across steps


class SyncState:
    """Everything the hook needs: the group of each parameter, owners, process groups, compressor states.

    Build it on every rank in the same order (it may create process subgroups, a collective
    call). ``close()`` stops the worker thread and destroys the subgroups. Plans and
    compressors receive it as ``comm``: ``pg``, ``world``, ``rank``, ``ranks_per_host``,
    ``intra_group``, ``leader_group``, ``mode_state``, ``global_rank(r)``.
    """

    def __init__(self, model: torch.nn.Module, strategy: Strategy, process_group=None,
                 ranks_per_host: int | None = None, embedding_names: set[str] | None = None,
                 force_worker: bool = False):
        global _BUILT
        _BUILT = True
        self.strategy = strategy
        self.pg = process_group if process_group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self.pg)
        self.rank = dist.get_rank(self.pg)
        strategy.check_world(self.world)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        group_of = strategy.resolve(named, embedding_names)
        self.group_of_param = {id(p): gi for (_, p), gi in zip(named, group_of)}
        group_bytes = [0] * len(strategy.groups)
        for (_, p), gi in zip(named, group_of):
            group_bytes[gi] += p.numel() * p.element_size()
        self.owners = strategy.owners(group_bytes, self.world)
        self.plans = [registry.plan(g.plan) for g in strategy.groups]
        self.compressors = [registry.compressor(g.compressor.name) for g in strategy.groups]
        self.mode = strategy.sync.kind
        self.iteration = 0
        plain = all(p.fast_path and c.identity for p, c in zip(self.plans, self.compressors))
        self.fast_path = plain and not self.mode.bypasses_plans and not force_worker
        self._subgroups: list = []
        self.delay = self.mode.delay(strategy.sync)
        if self.delay and not self.fast_path:
            # Delayed averages run on the worker while the next forward runs, where DDP issues collectives of its
            # own (rebuilding buckets, broadcasting buffers) from the main thread: on one process group the two
            # threads' collectives could interleave differently on each rank. The plans get their own copy.
            self.pg = dist.new_group(dist.get_process_group_ranks(self.pg))
            self._subgroups.append(self.pg)

        rph = ranks_per_host or self.world
        if self.world % rph:
            raise ValueError(f"ranks_per_host={rph} does not divide the world size {self.world}")
        self.ranks_per_host = rph
        self.intra_group = self.leader_group = None
        needs_hosts = self.mode.needs_hosts or any(p.needs_hosts for p in self.plans)
        if needs_hosts and 1 < rph:
            ranks = dist.get_process_group_ranks(self.pg)
            for h in range(self.world // rph):  # every rank creates every subgroup, in order
                grp = dist.new_group(ranks[h * rph:(h + 1) * rph])
                self._subgroups.append(grp)
                if h == self.rank // rph:
                    self.intra_group = grp
            if self.world > rph:
                self.leader_group = dist.new_group(ranks[::rph])
                self._subgroups.append(self.leader_group)

        self.mode_state = self.mode.make_state(self, strategy.sync)
        self.compressor_states = [c.make_state(self, g) for c, g in zip(self.compressors, strategy.groups)]
        members: list[list[torch.Tensor]] = [[] for _ in strategy.groups]
        for (_, p), gi in zip(named, group_of):
            members[gi].append(p)
        self.plan_states = [plan.make_state(self, model, ps) for plan, ps in zip(self.plans, members)]
        self._segments_cache: dict[tuple[int, ...], list[Segment]] = {}
        self._worker = None if self.fast_path else ThreadPoolExecutor(1, thread_name_prefix="autosync-sync")
        self.closers: list = []                  # called first by close() (asp's parameter server)
        self.hook_calls = 0                      # buckets the comm hook was handed (integrations report it)
        self._in_flight: deque = deque()         # per step: [(future, {param id: (offset, numel)}), ...]
        self._layouts: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}

    def subgroup(self, ranks: list[int]):
        """A new process subgroup of global ``ranks``, destroyed at :meth:`close` (every rank must call this for
        every subgroup, in the same order)."""
        group = dist.new_group(ranks)
        self._subgroups.append(group)
        return group

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank`` of this state's process group."""
        return dist.get_global_rank(self.pg, group_rank) if self.pg is not dist.group.WORLD else group_rank

    # --- layout ---------------------------------------------------------------------------
    def segments(self, params: list[torch.Tensor], numel: int) -> list[Segment]:
        key = tuple(id(p) for p in params)
        cached = self._segments_cache.get(key)
        if cached is not None:
            return cached
        segs: list[Segment] = []
        offset = 0
        run: list[tuple[int, torch.Tensor]] = []

        def flush() -> None:
            if run:
                start = run[0][0]
                shapes = tuple((o - start, p.numel(), p.shape) for o, p in run)
                segs.append(Segment(self.group_of_param[id(run[0][1])], start, offset,
                                    shapes, tuple(id(p) for _, p in run)))

        for p in params:
            gi = self.group_of_param[id(p)]
            if run and self.group_of_param[id(run[-1][1])] != gi:
                flush()
                run = []
            run.append((offset, p))
            offset += p.numel()
        flush()
        if offset != numel:
            raise RuntimeError(f"bucket layout mismatch: parameters hold {offset} elements, buffer {numel}")
        self._segments_cache[key] = segs
        return segs

    # --- running ----------------------------------------------------------------------------
    def run_segment(self, buffer: torch.Tensor, seg: Segment) -> None:
        """Average ``buffer[seg.start:seg.end]`` over ranks in place, by its group's compressor and plan."""
        gi = seg.group
        plan, owners = self.plans[gi], self.owners[gi]
        self.compressors[gi].run(self, buffer[seg.start:seg.end], seg, self.compressor_states[gi],
                                 lambda t: plan.run(self, t, seg, owners))

    def run_bucket(self, buffer: torch.Tensor, segments: list[Segment], is_last: bool) -> torch.Tensor:
        try:
            if self.mode.local_step(self, self.iteration, self.strategy.sync):
                self.mode.run_local(self, buffer)
            else:
                for seg in segments:
                    self.run_segment(buffer, seg)
        finally:
            if is_last:
                self.iteration += 1
                for c, state in zip(self.compressors, self.compressor_states):
                    c.end_step(state)
                for plan, state in zip(self.plans, self.plan_states):
                    plan.end_step(state)
        return buffer

    def error_norm(self) -> float:
        """The norm of every compressor's error-feedback residual on this rank (0 with none)."""
        norms = [c.error_norm(st) for c, st in zip(self.compressors, self.compressor_states)]
        return sum(n ** 2 for n in norms if n is not None) ** 0.5

    def submit(self, device: torch.device, fn, *args) -> torch.futures.Future:
        """Run ``fn(*args)`` on the worker thread; a future for its result, right on ``device``."""
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        fut = _future(device)

        def work() -> None:
            try:
                if stream is None:
                    fut.set_result(fn(*args))
                else:
                    with torch.cuda.device(device), torch.cuda.stream(stream):
                        fut.set_result(fn(*args))   # records an event on ``stream`` for DDP to wait on
            except BaseException as e:  # noqa: BLE001 - handed to DDP, which raises it in backward
                fut.set_exception(e)

        self._worker.submit(work)  # type: ignore[union-attr]
        return fut

    # --- delayed (ssp) ---------------------------------------------------------------------------
    def average(self, buffer: torch.Tensor, params: list[torch.Tensor], is_last: bool) -> torch.futures.Future:
        """Start averaging ``buffer`` (a bucket, or a copy of one) by the plans; a future of the average."""
        if self.fast_path:
            work = dist.all_reduce(buffer, group=self.pg, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0].div_(self.world))
        segments = self.segments(params, buffer.numel())
        return self.submit(buffer.device, self.run_bucket, buffer, segments, is_last)

    def delayed(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Send this step's bucket; hand DDP the average of its parameters' gradients of ``delay`` steps ago."""
        buffer = bucket.buffer()
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        layout = self._layouts.get(key)
        if layout is None:
            layout, offset = {}, 0
            for p in params:
                layout[id(p)] = (offset, p.numel())
                offset += p.numel()
            self._layouts[key] = layout
        if not self._in_flight or self._in_flight[-1][0]:      # the first bucket of a step
            self._in_flight.append([False, []])
        current = self._in_flight[-1]
        current[1].append((self.average(buffer.clone(), params, bucket.is_last()), layout))
        if len(self._in_flight) > self.delay:
            old = self._in_flight[0][1]
            for p in params:
                start, numel = layout[id(p)]
                for fut, lay in old:
                    if id(p) in lay:
                        o, n = lay[id(p)]
                        buffer[start:start + numel].copy_(fut.wait()[o:o + n])
                        break
                else:
                    buffer[start:start + numel].zero_()
        else:
            buffer.zero_()                                      # nothing is s steps old yet
        if bucket.is_last():
            current[0] = True
            if len(self._in_flight) > self.delay:
                self._in_flight.popleft()
            self.iteration += 1 if self.fast_path else 0      # run_bucket counts steps on the worker path
        done = _future(buffer.device)
        done.set_result(buffer)   # on CUDA: records an event on the current stream, which DDP waits on
        return done

    def drain(self) -> None:
        """Wait for every average still in flight (so that no collective outlives the state)."""
        while self._in_flight:
            for fut, _ in self._in_flight.popleft()[1]:
                try:
                    fut.wait()
                except Exception:  # noqa: BLE001 - a failed rank's error was raised in backward already
                    pass

    def close(self) -> None:
        drop_retired()          # the last strategy's groups: their callbacks ended long ago
        while self.closers:
            self.closers.pop(0)()
        self.drain()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        for plan, state in zip(self.plans, self.plan_states):
            plan.close_state(state)
        for grp in self._subgroups:
            try:
                dist.destroy_process_group(grp)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        retire(*self._subgroups)
        self._subgroups.clear()


def _future(device: torch.device) -> torch.futures.Future:
    """A future DDP can wait on for a tensor on ``device`` (on CUDA, by an event on the stream that sets it)."""
    return torch.futures.Future(devices=[device]) if device.type == "cuda" else torch.futures.Future()


def autosync_hook(state: SyncState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average ``bucket`` over ranks by the strategy's per-group plans."""
    state.hook_calls += 1
    if state.delay:
        return state.delayed(bucket)
    return state.average(bucket.buffer(), bucket.parameters(), bucket.is_last())
