"""The strategy space as an Optuna define-by-run space, and its mapping back to a Strategy.

Groups are formed from the profile, so the space has the same size for a model of ten
tensors or of hundreds: the tensors, in gradient-ready order (DDP's bucket order), are cut
into ``n_groups`` contiguous runs of about equal bytes; embedding tables, when the model
has them, may form a group of their own first. Each group then chooses a plan among those
of the registry (:mod:`autosync.plans`) that apply to it on this cluster, the plan's own
fields (``sharded_ps``: partitions), a compressor that works with the plan, and the
compressor's fields; then the global choices: bucket size, sync mode (and its fields) and,
where the mode allows it, ZeRO. Parameter names are distinct per condition
(``g1_compressor_allreduce``), which Optuna's samplers need for conditional spaces.
``lossless=True`` keeps only lossless choices.
"""
from __future__ import annotations

import optuna

from autosync import plans as registry
from autosync.profiler import Profile
from autosync.strategy import Strategy

BUCKET_CAPS_MB = (1.0, 4.0, 10.0, 25.0, 50.0, 100.0)
MAX_GROUPS = 4


def _chunks(names: list[str], sizes: list[int], n: int) -> list[list[str]]:
    """Cut ``names`` (in order) into at most ``n`` contiguous runs of about equal total size."""
    total = sum(sizes) or 1
    runs: list[list[str]] = [[]]
    acc = 0
    for name, size in zip(names, sizes):
        if runs[-1] and acc >= total * len(runs) / n and len(runs) < n:
            runs.append([])
        runs[-1].append(name)
        acc += size
    return [r for r in runs if r]


def suggest(trial: optuna.trial.BaseTrial, profile: Profile, lossless: bool = False) -> Strategy:
    """Ask ``trial`` for every choice and return the Strategy they make."""
    cluster = profile.cluster
    world = cluster.world_size
    params = profile.model.params
    embeddings = [p for p in params if p.is_embedding]
    split_emb = bool(embeddings) and trial.suggest_categorical("split_embeddings", [True, False])
    dense = [p for p in params if not (split_emb and p.is_embedding)]
    n_groups = trial.suggest_int("n_groups", 1, min(MAX_GROUPS, len(dense)))
    groups_names: list[tuple[list[str], bool]] = []
    if split_emb:
        groups_names.append(([p.name for p in embeddings], True))
    groups_names += [(run, False) for run in _chunks([p.name for p in dense], [p.nbytes for p in dense], n_groups)]

    groups = []
    for gi, (names, is_emb) in enumerate(groups_names):
        choices = [p.name for p in registry.PLANS.values()
                   if p.applicable(cluster.nodes, cluster.ranks_per_node, is_emb) and p.offered(params)]
        plan = trial.suggest_categorical(f"g{gi}_plan{'_emb' if is_emb else ''}", choices)
        group: dict = {"match": names, "plan": plan, **registry.plan(plan).suggest(trial, f"g{gi}", world)}
        comps = [c.name for c in registry.COMPRESSORS.values() if c.works_with(registry.plan(plan)) and not (lossless and c.lossy)]
        comp = trial.suggest_categorical(f"g{gi}_compressor_{plan}", comps)
        fields = registry.compressor(comp).suggest(trial, f"g{gi}")
        group["compressor"] = {"name": comp, **fields} if fields else comp
        groups.append(group)
    groups[-1]["match"] = "*"  # the last group takes the rest: shorter files, same cover

    raw: dict = {"groups": groups, "fusion": {"bucket_cap_mb": trial.suggest_categorical("bucket_cap_mb", BUCKET_CAPS_MB)}}
    modes = [m.name for m in registry.SYNC_MODES.values() if not (lossless and m.lossy) and m.offered(profile)]
    immediate = any(registry.plan(g["plan"]).immediate for g in groups)
    if immediate:   # sfb needs each step's own activations: no delayed or asynchronous mode (own parameter name)
        modes = [m for m in modes if registry.sync_mode(m).same_step]
    mode = modes[0] if len(modes) == 1 else trial.suggest_categorical(
        "sync_mode_immediate" if immediate else "sync_mode", modes)
    kind = registry.sync_mode(mode)
    fields = kind.suggest(trial, profile)
    if fields:
        raw["sync"] = {"mode": mode, **fields}
    if kind.allows_zero and trial.suggest_categorical("zero", [False, True]):
        raw["optimizer_sharding"] = "zero"
    return Strategy.from_dict(raw)


def random_strategies(profile: Profile, n: int, seed: int, lossless: bool = False,
                      modes: tuple[str, ...] | None = None) -> list[Strategy]:
    """``n`` distinct strategies drawn at random from the space (Optuna's RandomSampler), reproducibly.

    ``modes`` keeps only strategies of these sync modes: each draw fixes its sync mode (taking the modes in turn)
    and draws the rest as usual, so the other choices keep the space's distribution."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out: dict[str, Strategy] = {}
    for i in range(n * 20):
        if len(out) >= n:
            break
        if modes:
            study.enqueue_trial({"sync_mode": modes[i % len(modes)]})
        trial = study.ask()
        strategy = suggest(trial, profile, lossless)
        study.tell(trial, 0.0)
        if not modes or strategy.sync.mode in modes:
            out.setdefault(strategy.hash, strategy)
    return list(out.values())
