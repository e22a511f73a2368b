"""Collecting the efficiency table of a dataset: ``autosync efficiency``."""
from __future__ import annotations

import json

from autosync.efficiency import LOOPBACK, place, reusable, short_of_pairs
from autosync.efficiency.meter import EfficiencyMeter
from autosync.strategy import Strategy


def collect(store, workloads: list[str] | None = None, worlds: list[int] | None = None, per_group: int = 10,
            seed: int = 0, timeout_s: float = 1800.0, progress=None, again: bool = False,
            modes: tuple[str, ...] | None = None) -> dict[str, int]:
    """Measure the efficiency of the lossy strategies the dataset's trials hold, ``per_group`` keys per
    (workload, batch, world, hosts) group, in a seeded order (the same command continues the same list:
    what is stored is skipped). ``again``: instead, measure again every stored loopback row an older protocol
    measured differently (:func:`reusable`: censored at the horizon, or a band protocol 4 narrows with more seed
    pairs), or with fewer seed pairs than its mode needs (:func:`short_of_pairs`: extended, its seed-0 curve kept),
    each with its stored strategy (a row stored under an older key format is replaced by the row of its current
    key), whatever the seeded lists hold now (``per_group`` and ``seed`` do not apply). ``modes``: only the
    strategies of these sync modes (their own seeded lists). Returns counts of ok / failed / already stored, and
    ``rekeyed``: rows of an older key format whose current key was already measured, removed with nothing trained."""
    import random

    stored = store.efficiency_rows()
    # a censored row is measured again; one of a mode that drifts, with fewer seed pairs than it needs, is extended
    measured = {k for k, row in stored.items() if reusable(row) and not short_of_pairs(row)}
    counts = {"ok": 0, "failed": 0, "timeout": 0, "flat": 0, "stored": 0, "rekeyed": 0}
    groups: dict[tuple, dict[str, str]] = {}
    if again:
        for k, r in stored.items():
            if (k not in measured and place(k) in (None, LOOPBACK) and (not workloads or r["workload"] in workloads)
                    and (not worlds or r["world_size"] in worlds)
                    and (not modes or Strategy.from_dict(json.loads(r["strategy"])).sync.mode in modes)):
                groups.setdefault((r["workload"], int(r["batch_size"]), int(r["world_size"]),
                                   int(r["ranks_per_host"])), {})[k] = r["strategy"]
    else:
        trials = store.read(efficiency=False)
        trials = trials[~trials.lossless.astype(bool)]
        if workloads:
            trials = trials[trials.workload.isin(workloads)]
        if worlds:
            trials = trials[trials.world_size.isin(worlds)]
        for r in trials.itertuples():
            s = Strategy.from_dict(json.loads(r.strategy))
            if modes and s.sync.mode not in modes:
                continue
            rph = int(r.ranks_per_node) if s.sync.kind.needs_hosts else 1
            groups.setdefault((r.workload, int(r.batch_size), int(r.world_size), rph), {}).setdefault(
                r.efficiency_key, r.strategy)
    for (workload, batch, world, rph), keys in sorted(groups.items()):
        order = sorted(keys)
        random.Random(f"{seed}|{workload}|{batch}|{world}|{rph}").shuffle(order)
        chosen = order if again else order[:per_group]
        todo = [k for k in chosen if k not in measured]
        counts["stored"] += len(chosen) - len(todo)
        if not todo:
            continue
        with EfficiencyMeter(store, workload, batch, world, rph, timeout_s=timeout_s, progress=progress) as meter:
            for i, k in enumerate(todo):
                strategy = Strategy.from_dict(json.loads(keys[k]))
                current = meter.key(strategy)
                if again and current != k and current in measured:
                    # stored under an older key format, and its current key is measured: nothing to train
                    store.remove_efficiency({k})
                    counts["rekeyed"] += 1
                    continue
                if progress:
                    progress(f"{workload} b{batch} w{world}x{rph}: {i + 1}/{len(todo)}")
                row = meter.measure(strategy)
                counts[row["status"]] = counts.get(row["status"], 0) + 1
                if row["status"] == "ok":
                    measured.add(current)
                    if again and current != k:    # stored under an older key format: the new row replaces it
                        store.remove_efficiency({k})
    return counts
