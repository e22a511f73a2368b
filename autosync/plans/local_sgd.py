"""``local_sgd {period, warmup_steps}``: torch's post-local SGD (Lin et al. 2020).

For ``warmup_steps`` steps it is bsp. After them, gradients are averaged only inside a host
(one all-reduce per bucket on the host's ranks), and every ``period`` steps torch's
``PeriodicModelAverager`` averages the parameters of all ranks::

    bucket cost = t_ar^intra(n)  (several ranks per host; 0 with one)      lossy
    step cost  += t_ar(M) / period                     (M = the model's bytes, not overlapped)

``outer_compressor`` (fp16, bf16, int8, fp4) sends each rank's change since the last averaging through a
codec instead (:mod:`autosync.plans.outer`): the average is then of the parameters as the codec delivers them,
and the averaging's cost becomes an all-gather of the compressed bytes, ``t_ag(M_c) / period``.

It cannot be combined with ZeRO (the averager needs whole parameters on every rank).
"""
from __future__ import annotations

from autosync.plans.base import Field, SyncModeDef
from autosync.plans.outer import OUTER_CODECS, OUTER_COMPRESSOR, averager_class, codec_of, outer_cost

PERIODS = (2, 4, 8)
SEARCH_WARMUP_STEPS = 2


class LocalSGD(SyncModeDef):
    name = "local_sgd"
    lossy = True
    needs_hosts = True
    allows_zero = False
    bypasses_plans = True
    host_local_after_warmup = True
    wraps_optimizer = True
    min_pairs = 2
    fields = {"period": Field(4, 2, 10_000, unused=1), "warmup_steps": Field(10, 0, 1_000_000, unused=0, traffic=False),
              "outer_compressor": OUTER_COMPRESSOR}
    features = {"local_sgd": 0.0, "local_period": 1.0, "outer_bytes": 1.0}

    def suggest(self, trial, profile=None) -> dict:
        return {"warmup_steps": SEARCH_WARMUP_STEPS, "period": trial.suggest_categorical("local_sgd_period", PERIODS)}

    def steps_per_round(self, sync) -> int:
        return sync.period

    def window(self, sync) -> float:
        return float(sync.period)

    def local_step(self, comm, iteration: int, sync) -> bool:
        return iteration >= sync.warmup_steps

    def run_local(self, comm, buffer) -> None:
        """Average ``buffer`` over the ranks of this host only."""
        import torch.distributed as dist

        if comm.intra_group is not None:
            dist.all_reduce(buffer, group=comm.intra_group)
            buffer.div_(comm.ranks_per_host)

    def averager(self, sync, process_group):
        """The torch ModelAverager that averages the parameters of all ranks (frameworks with their own
        averaging step, e.g. Lightning's DDPStrategy, take it as it is); through a codec, the outer loop's averager
        at outer lr 1 without momentum."""
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        if sync.outer_compressor is not None:
            return averager_class()(sync, process_group)

        return PeriodicModelAverager(period=sync.period, warmup_steps=sync.warmup_steps, process_group=process_group)

    def wrap_optimizer(self, optimizer, sync, process_group):
        from torch.distributed.optim import PostLocalSGDOptimizer

        return PostLocalSGDOptimizer(optimizer, self.averager(sync, process_group))

    def bucket_cost(self, sim, nbytes: float, sync=None) -> float | None:
        if sim.ranks_per_node > 1 and sim.nodes > 1:
            return sim.t("all_reduce", nbytes, "intra")
        return sim.t("all_reduce", nbytes) if sim.nodes == 1 else 0.0

    def step_cost(self, sim, sync, model_bytes: float) -> float:
        return outer_cost(sim, sync, model_bytes)

    def sync_features(self, sync) -> dict[str, float]:
        return {"local_sgd": 1.0, "local_period": float(sync.period),
                "outer_bytes": OUTER_CODECS[codec_of(sync)] / 4}


MODE = LocalSGD()
