"""Hand-crafted strategies a user would otherwise pick, named after their sources.

Each is built from a Profile (parameter names, sizes, embeddings, world size):

- ``ddp_default``: PyTorch DDP as shipped: 25 MB buckets, one ring all-reduce.
- ``horovod_fp16``: Horovod's ``--fp16-allreduce``: every gradient all-reduced in fp16.
- ``powersgd_r4``: PowerSGD (Vogels et al. 2019) rank 4 with error feedback, torch's hook.
- ``ps``: one parameter server on rank 0 (AutoDist's ``PS``).
- ``ps_load_balancing``: one server per tensor, tensors placed greedily on the least-loaded
  rank by bytes (AutoDist's ``PSLoadBalancing``).
- ``partitioned_ps``: tensors of 1 MiB or more split into one shard per rank
  (reduce-scatter + all-gather), the rest load-balanced as above (AutoDist's ``PartitionedPS``).
- ``parallax``: embedding tables exchanged as row-sparse, dense tensors all-reduced
  (Kim et al., Parallax, EuroSys 2019). Equal to ``ddp_default`` for models without embeddings.
- ``hierarchical``: reduce inside each host, all-reduce among hosts, broadcast back
  (Horovod's hierarchical all-reduce).
- ``local_sgd_4``: post-local SGD (Lin et al. 2020), averaging every 4 steps after 2 warm-up steps.
- ``ssp_1``: stale synchronous parallel with staleness 1 (Ho et al. 2013): each step applies the
  average of the previous step's gradients, whose all-reduce overlaps this step's compute.
- ``asp``: an asynchronous parameter server on rank 0 (Downpour-style; a straggler slows only itself).
- ``adaptive_local_sgd``: local SGD that averages when the sampled divergence of the ranks'
  models exceeds 0.005, at least every 8 steps (PSP / Sync-on-the-fly style), after 2 warm-up steps.
- ``poseidon``: sufficient-factor broadcasting for the fully connected weights where Poseidon's rule
  says it moves less (:func:`autosync.plans.sfb.poseidon_rule`, from the profile's factor rows),
  all-reduce elsewhere (Zhang et al., Poseidon, USENIX ATC 2017). Left out when no weight qualifies.
- ``selective``: selective receivers (after SELMCAST): every step the gradient is averaged inside the
  islands of hosts joined by fast paths, every 4 steps the parameters of all ranks (after 2 warm-up
  steps); islands by :func:`autosync.plans.selective.pick` from the per-path bandwidths. Left out on
  an even cluster (no island choice between bsp and local SGD).
- ``diloco``: DiLoCo (Douillard et al. 2023): the user's optimizer inside, every 8 steps (after 2 warm-up
  steps) the averaged pseudo-gradient through an outer Nesterov SGD (lr 0.7, momentum 0.9), the paper's outer
  optimizer. The paper syncs every 500 steps over ~88,000; 8 keeps the paper's spirit (many outer rounds) on
  short runs: 30 outer rounds in the efficiency protocol's 240-step horizon.
- ``streaming_diloco``: Streaming DiLoCo (Douillard et al. 2025) at the same period: two fragments on a
  staggered schedule, each fragment's all-reduce overlapping one inner step, mixed half and half
  (alpha 0.5), pseudo-gradients sent as 4-bit floats.
"""
from __future__ import annotations

from autosync.plans.selective import pick, profile_frontier
from autosync.plans.sfb import poseidon_rule
from autosync.profiler import Profile
from autosync.strategy import Strategy

LARGE_TENSOR_BYTES = 1 << 20


def _per_tensor_ps(names: list[str]) -> list[dict]:
    return [{"match": n, "plan": "ps"} for n in names]


def baselines(profile: Profile) -> dict[str, Strategy]:
    """Name -> strategy, without duplicates (a baseline equal to an earlier one is left out)."""
    params = profile.model.params
    world = profile.cluster.world_size
    names = [p.name for p in params]
    embeddings = [p.name for p in params if p.is_embedding]
    large = [p.name for p in params if p.nbytes >= LARGE_TENSOR_BYTES]
    small = [n for n in names if n not in large]
    factored = [p.name for p in params if poseidon_rule(p.shape, p.factor_rows, world)]
    islands = pick(profile_frontier(profile))
    raw: dict[str, dict] = {
        "ddp_default": {},
        "horovod_fp16": {"groups": [{"match": "*", "compressor": "fp16"}]},
        "powersgd_r4": {"groups": [{"match": "*", "compressor": {"name": "powersgd", "rank": 4}}]},
        "ps": {"groups": [{"match": "*", "plan": "ps", "placement": [0]}]},
        "ps_load_balancing": {"groups": _per_tensor_ps(names)},
        "partitioned_ps": {"groups": ([{"match": large, "plan": "sharded_ps", "partitions": world}] if large else [])
                           + _per_tensor_ps(small)},
        "parallax": {"groups": ([{"match": embeddings, "plan": "row_sparse"}, {"match": "*"}]
                                if embeddings else [{"match": "*"}])},
        "hierarchical": {"groups": [{"match": "*", "plan": "hierarchical_allreduce"}]},
        "local_sgd_4": {"sync": {"mode": "local_sgd", "period": 4, "warmup_steps": 2}},
        "ssp_1": {"sync": {"mode": "ssp", "staleness": 1}},
        "asp": {"sync": "asp"},
        "adaptive_local_sgd": {"sync": {"mode": "adaptive", "max_period": 8, "threshold": 0.005, "warmup_steps": 2}},
        "poseidon": {"groups": [{"match": factored, "plan": "sfb"}, {"match": "*"}]} if factored else {},
        "selective": {"sync": {"mode": "selective", "islands": islands["text"], "period": 4, "warmup_steps": 2}}
        if islands else {},
        "diloco": {"sync": {"mode": "diloco", "period": 8, "warmup_steps": 2, "outer_lr": 0.7, "outer_momentum": 0.9}},
        "streaming_diloco": {"sync": {"mode": "diloco", "period": 8, "warmup_steps": 2, "outer_lr": 0.7,
                                      "outer_momentum": 0.9, "fragments": 2, "delay": 1, "mix": 0.5,
                                      "outer_compressor": "fp4"}},
    }
    out: dict[str, Strategy] = {}
    seen: set[str] = set()
    for name, spec in raw.items():
        if world == 1 and name != "ddp_default":
            continue
        if name == "partitioned_ps" and world == 1:
            continue
        strategy = Strategy.from_dict(spec)
        if strategy.hash not in seen:
            seen.add(strategy.hash)
            out[name] = strategy
    return out
