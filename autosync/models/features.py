"""Features of a (Profile, Strategy) pair for the learned cost model.

Normalized so that they carry across machines and models: communication in units of
compute time (``bytes * 8 / bandwidth / compute``), fractions of the model's bytes per plan
and per compressor and each registry entry's own features (:mod:`autosync.plans`),
compression ratio, shard balance, bucket counts; plus raw context
(ranks, hosts, log bandwidth, latency, log parameter count, whether compute was timed on a GPU) and the analytical
simulator's own predictions, as ratios to its prediction for the DDP default in the same
context. ``SIM_FEATURES`` names the simulator's columns, so the model can be trained
without them (ablation).
"""
from __future__ import annotations

import math

import numpy as np

from autosync import plans as registry
from autosync.models.simulator import SimResult, min_speed, simulate
from autosync.profiler import Profile
from autosync.strategy import Strategy

CONTEXT_FEATURES = ["world_size", "nodes", "ranks_per_node", "log_bandwidth", "latency_ms", "heterogeneous",
                    "log_params", "comm_intensity", "embedding_frac", "touched_rows"]
REGISTRY_FEATURES = list(registry.feature_defaults())   # frac_plan_*, frac_comp_*, and each entry's own
STRATEGY_FEATURES = (["log_bucket_cap", "n_buckets", "n_groups", "n_segments"] + REGISTRY_FEATURES
                     + ["compression", "zero", "owner_imbalance", "bytes_sent_ratio", "comm_units"])
SIM_FEATURES = ["sim_speedup", "sim_exposed_frac", "sim_comm_frac", "sim_log_step_ratio"]
#: the device the profile was timed on (1 = CUDA); appended last so older models' columns keep their order.
#: Every shipped row is CPU, so the shipped models were trained without it (a constant column).
DEVICE_FEATURES = ["device_gpu"]
#: uneven compute (slowest host's speed, intermittent stragglers' mean load y (x - 1)); appended last, as above.
COMPUTE_FEATURES = ["min_speed", "straggler_load"]
FEATURES = CONTEXT_FEATURES + STRATEGY_FEATURES + SIM_FEATURES + DEVICE_FEATURES + COMPUTE_FEATURES


def _default_sim(profile: Profile) -> SimResult:
    cached = getattr(profile, "_default_sim", None)
    if cached is None:
        cached = simulate(profile, Strategy.default())
        profile._default_sim = cached  # type: ignore[attr-defined]
    return cached


def featurize(profile: Profile, strategy: Strategy, sim: SimResult | None = None) -> dict[str, float]:
    """The cost model's features of ``strategy`` on ``profile`` (kept on the profile by the strategy's hash: a
    search asks for a candidate's several times, for its cost and for its efficiency)."""
    if sim is not None:
        return _featurize(profile, strategy, sim)
    memo = profile.__dict__.setdefault("_features", {})
    key = strategy.hash
    if key not in memo:
        memo[key] = _featurize(profile, strategy, None)
    return dict(memo[key])


def _featurize(profile: Profile, strategy: Strategy, sim: SimResult | None) -> dict[str, float]:
    m, c = profile.model, profile.cluster
    params = m.params
    total = max(m.total_bytes, 1)
    bandwidth = min(c.link_of(k).rate_bps for k in range(c.nodes))
    compute = max(m.forward_s + m.backward_s + m.optimizer_s, 1e-6)
    emb = [p for p in params if p.is_embedding]
    emb_bytes = sum(p.nbytes for p in emb)
    f: dict[str, float] = {
        "world_size": c.world_size, "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
        "log_bandwidth": math.log10(bandwidth), "latency_ms": max(c.link_of(k).latency_s for k in range(c.nodes)) * 1e3,
        "heterogeneous": float(c.heterogeneous), "log_params": math.log10(max(sum(p.numel for p in params), 1)),
        "comm_intensity": total * 8 / bandwidth / compute, "embedding_frac": emb_bytes / total,
        "touched_rows": (sum(p.touched_rows * p.nbytes for p in emb) / emb_bytes) if emb_bytes else 1.0,
    }
    emb_names = {p.name for p in emb}
    group_of = strategy.resolve([(p.name, None) for p in params], emb_names)
    group_bytes = [0] * len(strategy.groups)
    for p, gi in zip(params, group_of):
        group_bytes[gi] += p.nbytes
    own = registry.feature_defaults()
    for g, nbytes in zip(strategy.groups, group_bytes):
        share = nbytes / total
        own[f"frac_plan_{g.plan}"] += share
        own[f"frac_comp_{g.compressor.name}"] += share
        for name, value in (*registry.plan(g.plan).group_features(g.partitions, share).items(),
                            *registry.compressor(g.compressor.name).group_features(g.compressor, share).items()):
            own[name] += value
    own.update(strategy.sync.kind.sync_features(strategy.sync))
    owners = strategy.owners(group_bytes, c.world_size)
    load = [0.0] * c.world_size
    for nbytes, ranks in zip(group_bytes, owners):
        for r in ranks:
            load[r] += nbytes / len(ranks)
    ps_total = sum(load)
    imbalance = max(load) / (ps_total / c.world_size) if ps_total else 1.0

    sim = sim or simulate(profile, strategy)
    base = _default_sim(profile)
    sent = sum(sim.bytes_per_plan.values())
    f.update({
        "log_bucket_cap": math.log10(strategy.fusion.bucket_cap_mb), "n_buckets": sim.n_buckets,
        "n_groups": len(strategy.groups), "n_segments": sim.n_segments,
        **own,
        "compression": sent / total if sent else 1.0,
        "zero": float(strategy.optimizer_sharding == "zero"),
        "owner_imbalance": imbalance, "bytes_sent_ratio": sent / total,
        "comm_units": sent * 8 / bandwidth / compute,
        "sim_speedup": base.step_s / sim.step_s, "sim_exposed_frac": sim.exposed_comm_s / sim.step_s,
        "sim_comm_frac": sim.comm_s / max(sim.compute_s, 1e-9),
        "sim_log_step_ratio": math.log(sim.step_s / base.step_s),
        "device_gpu": float(profile.context.device == "cuda"),
        "min_speed": min_speed(profile),
        "straggler_load": (c.stragglers.fraction * (c.stragglers.slowdown - 1)) if c.stragglers else 0.0,
    })
    return f


def feature_matrix(rows: list[dict[str, float]], names: list[str] = FEATURES) -> np.ndarray:
    return np.array([[r[n] for n in names] for r in rows], dtype=np.float64)
