"""One DDP communication hook that carries out every group's plan.

DDP hands the hook a *bucket*: a flat buffer holding the gradients of several parameters,
laid end to end in ``bucket.parameters()`` order. The hook cuts the buffer into
*segments*, maximal runs of parameters that belong to the same strategy group, and runs
each segment's plan on its view of the buffer, in place. With ``W`` ranks and local
gradient ``g_r`` on rank ``r``, every lossless plan leaves ``(1/W) * sum_r g_r`` in the
buffer on every rank; they differ in who talks to whom:

- ``allreduce``:  ring all-reduce of the segment.
- ``hierarchical_allreduce``: reduce to the host leader, all-reduce among leaders,
  broadcast inside the host.
- ``ps``: reduce to the owner rank, broadcast from it.
- ``sharded_ps``: the segment cut into ``P`` contiguous shards, shard ``i`` reduced to and
  broadcast from ``owner[i]``; with one shard per rank in rank order this is
  reduce_scatter + all_gather.
- ``row_sparse``: per embedding table, only the rows with a non-zero gradient (the rows the
  batch touched) are all-gathered as (indices, values) and scatter-added.

Compressors: ``fp16``/``bf16`` send ``g_r / W`` cast down and cast the sum back up;
``powersgd`` runs torch's ``powerSGD_hook`` on the segment (rank-``k`` factors
``P``, ``Q`` with error feedback); ``topk`` sends the ``k = ratio * n`` largest entries of
``g_r + e_r`` and keeps the rest as the next step's error ``e_r``.

Plans run one segment after another on a single worker thread per rank, so every rank
issues the same collectives in the same order while backward goes on (overlap). When
every group is a plain all-reduce, the hook issues one asynchronous all-reduce per bucket
instead, like DDP's own ``allreduce_hook``.
"""
# No "from __future__ import annotations": DDP checks the hook's annotations at run time.

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

from autosync.strategy import Group, Strategy

log = logging.getLogger(__name__)
LOW_PRECISION = {"fp16": torch.float16, "bf16": torch.bfloat16}
# torch >= 2.10 renamed the tensor forms of these collectives; keep working on 2.4 too.
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass(frozen=True)
class Segment:
    """A run of parameters of one group inside a bucket: buffer[start:end]."""

    group: int
    start: int
    end: int
    shapes: tuple[tuple[int, int, torch.Size], ...]  # (offset within segment, numel, shape) per parameter
    key: tuple[int, ...]                               # id() of each parameter: stable across steps


class _SegmentBucket:
    """The part of a GradBucket that torch's powerSGD_hook reads, for one segment."""

    def __init__(self, index: int, flat: torch.Tensor, seg: Segment):
        self._index, self._flat = index, flat
        self._grads = [flat[o:o + n].view(shape) for o, n, shape in seg.shapes]

    def buffer(self) -> torch.Tensor:
        return self._flat

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:  # iterations are counted by SyncState, once per backward
        return False


def balanced_owners(strategy: Strategy, group_bytes: list[int], world: int) -> list[tuple[int, ...]]:
    """Owner ranks of every ps / sharded_ps group, the explicit placement or balanced by bytes.

    Greedy: items (a ps group, or one shard of a sharded_ps group) go, largest first, to the
    least-loaded rank so far. A sharded_ps group with one shard per rank gets ranks in order,
    which lets it run as reduce_scatter + all_gather.
    """
    load = [0] * world
    owners: list[tuple[int, ...]] = [()] * len(strategy.groups)
    items = []
    for gi, g in enumerate(strategy.groups):
        if g.placement is not None:
            owners[gi] = g.placement
            per = group_bytes[gi] // len(g.placement)
            for r in g.placement:
                load[r] += per
        elif g.plan == "ps":
            items.append((group_bytes[gi], gi, 0))
        elif g.plan == "sharded_ps":
            if g.partitions == world:
                owners[gi] = tuple(range(world))
                for r in range(world):
                    load[r] += group_bytes[gi] // world
            else:
                owners[gi] = (0,) * g.partitions
                items += [(group_bytes[gi] // g.partitions, gi, s) for s in range(g.partitions)]
    for nbytes, gi, shard in sorted(items, key=lambda t: (-t[0], t[1], t[2])):
        r = min(range(world), key=lambda k: (load[k], k))
        load[r] += nbytes
        if strategy.groups[gi].plan == "ps":
            owners[gi] = (r,)
        else:
            owners[gi] = owners[gi][:shard] + (r,) + owners[gi][shard + 1:]
    return owners


class SyncState:
    """Everything the hook needs: the group of each parameter, owners, process groups, memories.

    Build it on every rank in the same order (it may create process subgroups, a collective
    call). ``close()`` stops the worker thread and destroys the subgroups.
    """

    def __init__(self, model: torch.nn.Module, strategy: Strategy, process_group=None,
                 ranks_per_host: int | None = None, embedding_names: set[str] | None = None,
                 force_worker: bool = False):
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
        self.owners = balanced_owners(strategy, group_bytes, self.world)
        self.iteration = 0
        self.local_sgd = strategy.sync.mode == "local_sgd"

        rph = ranks_per_host or self.world
        if self.world % rph:
            raise ValueError(f"ranks_per_host={rph} does not divide the world size {self.world}")
        self.ranks_per_host = rph
        self.intra_group = self.leader_group = None
        self._subgroups: list = []
        needs_hosts = self.local_sgd or any(g.plan == "hierarchical_allreduce" for g in strategy.groups)
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

        self.powersgd = {gi: torch_powersgd.PowerSGDState(
            process_group=self.pg, matrix_approximation_rank=g.compressor.rank, start_powerSGD_iter=2,
            min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0)
            for gi, g in enumerate(strategy.groups) if g.compressor.name == "powersgd"}
        self.topk_error: dict[tuple[int, ...], torch.Tensor] = {}
        self._segments_cache: dict[tuple[int, ...], list[Segment]] = {}
        self._segment_ids: dict[tuple[int, ...], int] = {}
        plain = all(g.plan == "allreduce" and g.compressor.name == "none" for g in strategy.groups)
        self.fast_path = plain and not self.local_sgd and not force_worker
        self._worker = None if self.fast_path else ThreadPoolExecutor(1, thread_name_prefix="autosync-sync")

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

    def _global(self, group_rank: int) -> int:
        return dist.get_global_rank(self.pg, group_rank) if self.pg is not dist.group.WORLD else group_rank

    # --- plans: each sums ``t`` over ranks in place -----------------------------------------
    def _allreduce(self, t: torch.Tensor, group=None) -> None:
        dist.all_reduce(t, group=group or self.pg)

    def _hierarchical(self, t: torch.Tensor) -> None:
        if self.intra_group is None:
            return self._allreduce(t)
        leader = self._global((self.rank // self.ranks_per_host) * self.ranks_per_host)
        dist.reduce(t, dst=leader, group=self.intra_group)
        if self.leader_group is not None and self.rank % self.ranks_per_host == 0:
            dist.all_reduce(t, group=self.leader_group)
        dist.broadcast(t, src=leader, group=self.intra_group)

    def _sharded(self, t: torch.Tensor, owners: tuple[int, ...]) -> None:
        n, parts = t.numel(), len(owners)
        if parts == self.world and owners == tuple(range(self.world)):
            size = -(-n // parts)
            padded = torch.zeros(size * parts, dtype=t.dtype)
            padded[:n] = t
            mine = torch.empty(size, dtype=t.dtype)
            _reduce_scatter(mine, padded, group=self.pg)
            _all_gather(padded, mine, group=self.pg)
            t.copy_(padded[:n])
            return
        bounds = [n * i // parts for i in range(parts + 1)]
        shards = [(t[a:b], self._global(o)) for a, b, o in zip(bounds, bounds[1:], owners) if b > a]
        for work in [dist.reduce(s, dst=o, group=self.pg, async_op=True) for s, o in shards]:
            work.wait()
        for work in [dist.broadcast(s, src=o, group=self.pg, async_op=True) for s, o in shards]:
            work.wait()

    def _row_sparse(self, t: torch.Tensor, seg: Segment) -> None:
        for off, numel, shape in seg.shapes:
            grad = t[off:off + numel]
            if len(shape) != 2:
                self._allreduce(grad)
                continue
            rows = grad.view(shape)
            idx = rows.abs().sum(1).nonzero().squeeze(1)
            counts = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
            dist.all_gather(counts, torch.tensor([idx.numel()]), group=self.pg)
            width = int(max(c.item() for c in counts))
            send_idx = torch.zeros(width, dtype=torch.long)
            send_idx[:idx.numel()] = idx
            send_val = torch.zeros(width, shape[1], dtype=t.dtype)
            send_val[:idx.numel()] = rows[idx]           # padding rows add zeros to row 0
            all_idx = torch.empty(width * self.world, dtype=torch.long)
            all_val = torch.empty(width * self.world, shape[1], dtype=t.dtype)
            _all_gather(all_idx, send_idx, group=self.pg)
            _all_gather(all_val, send_val, group=self.pg)
            rows.zero_().index_add_(0, all_idx, all_val)

    def _run_plan(self, g: Group, gi: int, t: torch.Tensor, seg: Segment) -> None:
        if g.plan == "allreduce":
            self._allreduce(t)
        elif g.plan == "hierarchical_allreduce":
            self._hierarchical(t)
        elif g.plan == "ps":
            owner = self._global(self.owners[gi][0])
            dist.reduce(t, dst=owner, group=self.pg)
            dist.broadcast(t, src=owner, group=self.pg)
        elif g.plan == "sharded_ps":
            self._sharded(t, self.owners[gi])
        elif g.plan == "row_sparse":
            self._row_sparse(t, seg)
        else:  # pragma: no cover - Strategy validation rules it out
            raise ValueError(g.plan)

    # --- compressors ------------------------------------------------------------------------
    def _topk(self, flat: torch.Tensor, seg: Segment, ratio: float) -> None:
        corrected = flat + self.topk_error.get(seg.key, 0)
        k = max(1, int(ratio * flat.numel()))
        idx = corrected.abs().topk(k, sorted=False).indices
        values = corrected[idx]
        error = corrected
        error[idx] = 0
        self.topk_error[seg.key] = error
        all_idx = torch.empty(k * self.world, dtype=torch.long)
        all_val = torch.empty(k * self.world, dtype=flat.dtype)
        _all_gather(all_idx, idx, group=self.pg)
        _all_gather(all_val, values, group=self.pg)
        flat.zero_().index_add_(0, all_idx, all_val).div_(self.world)

    def _powersgd(self, flat: torch.Tensor, seg: Segment, gi: int) -> None:
        seg_id = self._segment_ids.setdefault(seg.key, len(self._segment_ids))
        out = torch_powersgd.powerSGD_hook(self.powersgd[gi], _SegmentBucket(seg_id, flat, seg)).wait()
        if out.data_ptr() != flat.data_ptr():
            flat.copy_(out)

    def run_segment(self, buffer: torch.Tensor, seg: Segment) -> None:
        """Average ``buffer[seg.start:seg.end]`` over ranks in place, by its group's plan."""
        gi = seg.group
        g = self.strategy.groups[gi]
        flat = buffer[seg.start:seg.end]
        name = g.compressor.name
        if name == "powersgd":
            self._powersgd(flat, seg, gi)
        elif name == "topk":
            self._topk(flat, seg, g.compressor.ratio)
        elif name in LOW_PRECISION:
            low = flat.div(self.world).to(LOW_PRECISION[name])
            self._run_plan(g, gi, low, seg)
            flat.copy_(low)
        else:
            self._run_plan(g, gi, flat, seg)
            flat.div_(self.world)

    def local_phase(self) -> bool:
        """True once local SGD's warm-up is over: gradients stay on the host."""
        return self.local_sgd and self.iteration >= self.strategy.sync.warmup_steps

    def run_bucket(self, buffer: torch.Tensor, segments: list[Segment], is_last: bool) -> torch.Tensor:
        try:
            if self.local_phase():
                if self.intra_group is not None:
                    dist.all_reduce(buffer, group=self.intra_group)
                    buffer.div_(self.ranks_per_host)
            else:
                for seg in segments:
                    self.run_segment(buffer, seg)
        finally:
            if is_last:
                self.iteration += 1
                for ps in self.powersgd.values():
                    ps.iter += 1
        return buffer

    def submit(self, fn, *args) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()

        def work() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to DDP, which raises it in backward
                fut.set_exception(e)

        self._worker.submit(work)  # type: ignore[union-attr]
        return fut

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        for grp in self._subgroups:
            try:
                dist.destroy_process_group(grp)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._subgroups.clear()


def autosync_hook(state: SyncState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average ``bucket`` over ranks by the strategy's per-group plans."""
    buffer = bucket.buffer()
    if state.fast_path:
        work = dist.all_reduce(buffer, group=state.pg, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0].div_(state.world))
    segments = state.segments(bucket.parameters(), buffer.numel())
    return state.submit(state.run_bucket, buffer, segments, bucket.is_last())
