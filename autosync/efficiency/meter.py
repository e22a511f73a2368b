"""The efficiency meter: measures (or reuses) the efficiency of a strategy's lossy choices against the DDP default."""
from __future__ import annotations

import numpy as np

from autosync.efficiency import (BAND_LIMIT, DEFAULT_EVAL_EVERY, DEFAULT_HORIZON, EXTEND, LOOPBACK, MAX_PAIRS, REFERENCE_SEEDS,
                                 Curve, CurveSpec, _curve_of, as_protocol, compare, efficiency_row, is_flat, key, lr_of,
                                 pairs_of, reference_key, reusable, short_of_pairs, target)
from autosync.efficiency.train import measure_curve
from autosync.errors import UserError
from autosync.strategy import Strategy

class EfficiencyMeter:
    """Measures efficiencies on loopback ranks, storing every curve; stored ones are reused (resume). A new
    measurement takes the place of a stored row of its key that could not be reused (see :func:`reusable`).

    One meter per (workload, batch, world, hosts). ``measure(strategy)`` returns the stored or
    newly measured row (a dict, see :func:`efficiency_row`) of the strategy's efficiency key; while its band is
    wider than ``BAND_LIMIT`` it trains another pair of seeds (reference and candidate), up to ``MAX_PAIRS``; a mode
    that drifts (its ``min_pairs``) trains at least that many pairs, and a stored row of it with fewer is extended.

    An asynchronous mode (asp) is timing-dependent: once :meth:`on_cluster` has given the meter the
    cluster's own ranks, it is trained there (its key and row name the cluster); without them it is
    trained on loopback and its key and row say ``loopback``.
    """

    def __init__(self, store, workload, batch_size: int, world: int, ranks_per_host: int = 1,
                 horizon: int | None = None, eval_every: int = DEFAULT_EVAL_EVERY, lr: float | None = None,
                 optimizer: str = "adam", timeout_s: float = 1800.0, pool=None, progress=None, also=(),
                 band_limit: float = BAND_LIMIT, max_pairs: int = MAX_PAIRS):
        self.store = store
        self.also = list(also)          # more stores whose measurements are reused (e.g. the shipped dataset)
        self.workload, self.name = workload, str(workload)
        self.batch, self.world, self.rph = batch_size, world, ranks_per_host
        self.horizon = horizon or DEFAULT_HORIZON
        self.eval_every, self.lr, self.optimizer = eval_every, lr or lr_of(workload), optimizer
        self.timeout_s = timeout_s
        self.band_limit, self.max_pairs = band_limit, max_pairs
        self._pool, self._own_pool = pool, pool is None
        self.progress = progress
        self._references: list[Curve] = []
        self._also_rows: list[dict] | None = None
        self._cluster_pool, self.cluster = None, None

    def on_cluster(self, pool, cluster: str) -> None:
        """Train timing-dependent (asynchronous) modes on ``pool``, the ranks of the cluster ``cluster`` (a spec),
        from now on; the caller keeps owning the pool."""
        self._cluster_pool, self.cluster = pool, cluster

    def where(self, strategy: Strategy) -> str | None:
        """Where ``strategy``'s efficiency is measured: the cluster's spec, ``loopback``, or None (anywhere:
        a synchronous mode's efficiency does not depend on timing)."""
        if not strategy.sync.kind.asynchronous:
            return None
        return self.cluster if self._cluster_pool is not None else LOOPBACK

    def key(self, strategy: Strategy) -> str:
        return key(self.name, self.batch, self.world, self.rph, strategy, self.where(strategy))

    def _spec(self, strategy: Strategy, seed: int, goal: float | None = None) -> CurveSpec:
        """The run of ``strategy``; a candidate (``goal`` = L*) short of L* at the horizon trains on (``EXTEND``)."""
        on_cluster = self.where(strategy) not in (None, LOOPBACK)     # asp on the cluster: its own pace per rank
        return CurveSpec(self.workload, strategy.canonical(), self.batch, self.horizon, self.eval_every, seed,
                         self.lr, self.optimizer, timed=on_cluster, goal=goal,
                         extend_to=EXTEND * self.horizon if goal is not None else None)

    def pool(self):
        if self._pool is None:
            from autosync.executor.launch import RankPool

            self._pool = RankPool(self.world, self.rph, network="unshaped")
        return self._pool

    def close(self, failed: bool = False) -> None:
        """Let the own pool's ranks leave; ``failed`` (unwinding from an exception): kill them at once."""
        if self._own_pool and self._pool is not None:
            self._pool.kill() if failed else self._pool.close()
            self._pool = None

    def __enter__(self) -> "EfficiencyMeter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    def _stored(self, ekey: str) -> dict | None:
        if self._also_rows is None:     # the other stores are only read: once is enough
            self._also_rows = [store.efficiency_rows() for store in self.also]
        for rows in (self.store.efficiency_rows(), *self._also_rows):
            row = rows.get(ekey)
            if (row is not None and reusable(row) and row.get("horizon") == self.horizon
                    and row.get("lr") == self.lr):
                return as_protocol(row)
        return None

    def noise_scale(self) -> float:
        """The reference runs' gradient noise scale, when they are stored (NaN otherwise; nothing is run)."""
        vals = [r["grad_noise_scale"] for r in (self._stored(reference_key(self.name, self.batch, self.world, s))
                                                for s in range(REFERENCE_SEEDS)) if r is not None]
        return float(np.mean(vals)) if vals else float("nan")

    def _run(self, strategy: Strategy, seed: int, ekey: str, what: str,
             goal: float | None = None) -> tuple[Curve | None, str, str]:
        from autosync.executor.launch import TrialFailure

        where = self.where(strategy)
        on_cluster = where not in (None, LOOPBACK)
        if self.progress:
            longer = f", on to {EXTEND * self.horizon} if short of L*" if goal is not None else ""
            self.progress(f"training {what} for {self.horizon} steps{longer} (efficiency, "
                          f"{'on the cluster ' + where if on_cluster else 'loopback'})")
        try:
            pool = self._cluster_pool if on_cluster else self.pool()
            return measure_curve(pool, self._spec(strategy, seed, goal), self.timeout_s), "ok", ""
        except TrialFailure as f:
            return None, f.status, f.reason

    def references(self, seeds: int = REFERENCE_SEEDS) -> list[Curve]:
        """The DDP default's curves from ``seeds`` seeds (each measured once, then stored)."""
        default = Strategy.default()
        for seed in range(len(self._references), seeds):
            ekey = reference_key(self.name, self.batch, self.world, seed)
            row = self._stored(ekey)
            if row is None or row["status"] != "ok":
                curve, status, reason = self._run(default, seed, ekey, f"the reference (seed {seed})")
                if curve is None:
                    raise UserError(f"efficiency: the reference run of {self.name} {status}: {reason}")
                row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, default,
                                     self._spec(default, seed), curve, None)
                row.update(efficiency=1.0, efficiency_raw=1.0, efficiency_lo=1.0, efficiency_hi=1.0)
                self.store.replace_efficiency([row])
            self._references.append(_curve_of(row))
        return self._references[:seeds]

    def stored(self, strategy: Strategy) -> dict | None:
        """The stored efficiency row of ``strategy``'s lossy choices, or None; nothing is run."""
        return self._stored(self.key(strategy))

    def measure(self, strategy: Strategy) -> dict:
        """The efficiency row of ``strategy`` (lossless: efficiency 1 by definition, nothing run)."""
        ekey = self.key(strategy)
        if strategy.is_lossless:
            return {"efficiency_key": ekey, "status": "ok", "efficiency": 1.0, "efficiency_lo": 1.0,
                    "efficiency_hi": 1.0, "band": 0.0, "within_noise": True, "final_loss_ratio": 1.0,
                    "lossless": True}
        need = strategy.sync.kind.min_pairs
        row = self._stored(ekey)
        if row is not None and not short_of_pairs(row):
            return row
        refs = self.references()
        start, goal = float(np.mean([c.eval_loss[0] for c in refs])), target(refs, self.horizon)
        if is_flat(start, goal):
            row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, strategy,
                                 self._spec(strategy, 0), None, None, "flat",
                                 f"the reference's evaluation loss fell only {start:.4g} -> {goal:.4g} by 3/4 of "
                                 f"{self.horizon} steps: too flat to measure an efficiency")
            self.store.replace_efficiency([row])
            return row
        if row is not None:        # stored with fewer pairs than the mode needs: its seed-0 curve stands
            curve, status, reason = _curve_of(row), "ok", ""
            if self.progress:
                self.progress(f"stored with {pairs_of(row)} seed pair(s); {strategy.sync.mode} pairs at least {need}")
        else:
            curve, status, reason = self._run(strategy, 0, ekey, f"lossy strategy {strategy.hash}", goal)
        eff = compare(refs, curve, self.horizon) if curve is not None else None
        curves = [curve]
        while (eff is not None and eff.raw > 0 and (eff.band > self.band_limit or len(curves) < need)
               and len(curves) < max(self.max_pairs, need)):
            seed = len(curves)
            if self.progress:
                why = (f"band +-{eff.band:.0%} is wider than +-{self.band_limit:.0%}" if eff.band > self.band_limit
                       else f"{strategy.sync.mode} pairs at least {need} seeds")
                self.progress(f"{why}: pair {seed + 1} of at most {max(self.max_pairs, need)}")
            more, status2, reason2 = self._run(strategy, seed, ekey, f"lossy strategy {strategy.hash} (seed {seed})",
                                               goal)
            if more is None:       # the pairs so far stand; the row says why there are no more
                reason = f"seed {seed} {status2}: {reason2}"
                break
            curves.append(more)
            eff = compare(self.references(max(REFERENCE_SEEDS, len(curves))), curves, self.horizon)
        row = efficiency_row(ekey, self.name, self.batch, self.world, self.rph, strategy, self._spec(strategy, 0),
                             curve, eff, status, reason)
        self.store.replace_efficiency([row])
        return row


