"""Rank side of bench/online_tuning.py: the efficiency protocol's timed training, with ``strategy="auto"``.

A module of its own (not the script) so that the rank processes can import what the script sends them."""
from autosync.efficiency import Curve, CurveSpec
from autosync.efficiency.train import _CurveRun


def predict_without(cost_model, eff_model, base, card, objective, rule, profile, k, adapt=None):
    """``strategy="auto"``'s prediction with models fitted without the workload under test (the benchmark's
    ``predict`` option: ``functools.partial(predict_without, cost_model, eff_model, base, card, objective, rule)``;
    ``rule``: how a lossy candidate's efficiency is judged, "lower" or "point")."""
    from autosync.search.config import TuneConfig
    from autosync.search.online import PROPOSALS, predict_candidates

    config = TuneConfig.build(measure=0, objective=objective, candidates=PROPOSALS, zero_shot=rule)
    return predict_candidates(profile, cost_model, base, card, config, k, adapt, eff_model)


class AutoCurveRun(_CurveRun):
    """The curve run of :mod:`autosync.efficiency.train`, trained through ``autosync.apply(model, optimizer,
    "auto", **options)`` instead of a fixed strategy: the same weights, data order, learning rate and evaluations,
    so its time to L* compares with a fixed strategy's. The tuner's own work (the network's collectives, switches,
    decisions, rank 0's prediction thread) happens inside the optimizer's step, so it is inside the timed
    training."""

    def __init__(self, ctx, spec: CurveSpec, options: dict):
        self.options, self.ranks_per_host = options, ctx.ranks_per_host
        super().__init__(ctx, spec)

    def wrap(self, optimizer):
        from autosync.api import auto

        return auto(self.model, optimizer, ranks_per_host=self.ranks_per_host, **self.options)

    def release(self) -> None:
        self.ddp.release()

    def run(self):
        out = super().run()
        t = self.ddp.autosync_tuner
        out["auto"] = {"windows": [w.as_dict() for w in t.windows], "committed": t.committed.canonical()
                       if t.committed else None, "committed_summary": t.committed.summary() if t.committed else None,
                       "committed_at": t.committed_at if t.committed else None, "why": t.committed_why,
                       "lost_s": t.lost_s(),
                       "overhead_s": t.overhead_s, "overhead_parts": dict(t.overhead_parts),
                       "waited_s": t.waited_s,
                       "trained_s": t.trained_s,
                       "exploration_steps": t.exploration_steps() if t.committed else None,
                       "default_step_s": t.default_step_s(), "reverted": t.reverted}
        return out


def train_auto_curve(ctx, spec: CurveSpec, options: dict) -> dict:
    return AutoCurveRun(ctx, spec, options).run()


def measure_auto_curve(pool, spec: CurveSpec, options: dict, timeout: float) -> tuple[Curve, dict]:
    raw = pool.run(train_auto_curve, spec, options, timeout=timeout)[0]
    return Curve(raw["steps"], raw["eval_loss"], raw["train_loss"], raw["signals"], raw["wall_s"],
                 raw["train_s"]), raw["auto"]


class ScheduledCurveRun(_CurveRun):
    """The curve run trained through the switcher ``strategy="auto"`` uses (:class:`~autosync.executor.switch.
    SwitchableModel`), switched at fixed steps instead of by a tuner: ``schedule`` = [(steps taken, strategy as a
    canonical dict), ...], each switch made after that many optimizer steps, on every rank."""

    def __init__(self, ctx, spec: CurveSpec, schedule: list):
        from autosync.strategy import Strategy

        self.schedule = {int(s): Strategy.from_dict(d) for s, d in schedule}
        self.ranks_per_host = ctx.ranks_per_host
        super().__init__(ctx, spec)

    def wrap(self, optimizer):
        from autosync.executor.switch import SwitchableModel, SwitchableOptimizer
        from autosync.strategy import Strategy

        model = SwitchableModel(self.model, Strategy.default(), ranks_per_host=self.ranks_per_host)
        opt = SwitchableOptimizer(optimizer)
        model.bind(opt)

        def after_step():
            strategy = self.schedule.get(opt.steps)
            if strategy is not None:
                error = model.switch(strategy)
                if error:
                    raise RuntimeError(f"switch to {strategy.summary()} at step {opt.steps}: {error}")
        opt.on_step.append(after_step)
        return model, opt

    def release(self) -> None:
        self.ddp.release()


def train_scheduled_curve(ctx, spec: CurveSpec, schedule: list) -> dict:
    return ScheduledCurveRun(ctx, spec, schedule).run()
