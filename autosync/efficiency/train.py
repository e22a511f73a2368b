"""The rank side of the efficiency protocol (:mod:`autosync.efficiency`): paired training runs on real ranks."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

from autosync.efficiency import EVAL_SAMPLES, EVAL_SEED, Curve, CurveSpec, steps_by, steps_to
from autosync.strategy import Strategy

def _flat_grads(params) -> "Any":
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).double()
                      for p in params])


def train_curve(ctx, spec: CurveSpec) -> dict[str, Any]:
    """Rank-side body: train ``spec.horizon`` steps by the strategy, evaluating the consensus model; with
    ``spec.goal`` and ``spec.extend_to`` set, a curve that has not reached ``goal`` by the horizon trains on until it
    has (confirmed by the next evaluation), at most ``extend_to`` steps (signals are taken over the horizon only).

    Timed mode (``spec.timed`` or ``spec.stop_at`` set): no signals and no per-step loss reduction (nothing but
    the strategy's own communication runs between evaluations, so an asynchronous mode's ranks keep their own
    pace), the training time is read at every evaluation with the clock paused while evaluating, and training
    stops as soon as the smoothed curve has crossed ``stop_at`` (when set) with the crossing confirmed by the
    next evaluation (the centred smoothing needs it), or after ``max_train_s``."""
    return _CurveRun(ctx, spec).run()


class _CurveRun:
    """One rank's part of a curve: the model, its data, its evaluation set and what it has recorded so far."""

    def __init__(self, ctx, spec: CurveSpec):
        import torch

        from autosync import workloads
        from autosync.executor.device import to_device
        from autosync.executor.recipe import data_generator, make_optimizer

        self.t0 = time.monotonic()
        self.spec, self.device, self.world, self.workloads = spec, ctx.device, ctx.world_size, workloads
        self.strategy = Strategy.from_dict(spec.strategy)
        self.model, self.make_batch = workloads.build(spec.workload, seed=spec.seed)
        self.model.to(self.device)
        optimizer = make_optimizer(spec.optimizer, spec.lr, self.model.parameters())
        self.ddp, self.optimizer = self.wrap(optimizer)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.gen = data_generator(spec.seed, ctx.rank)
        eval_gen = torch.Generator().manual_seed(EVAL_SEED)
        self.n_eval = max(self.world, math.ceil(EVAL_SAMPLES / spec.batch_size))
        self.n_eval -= self.n_eval % self.world
        eval_batches = [to_device(self.make_batch(spec.batch_size, eval_gen), self.device) for _ in range(self.n_eval)]
        self.mine = eval_batches[ctx.rank::self.world]
        self.consensus = None
        self.sig: dict[str, list[float]] = {"grad_error": [], "ef_norm": [], "local_drift": [], "grad_noise_scale": []}
        self.timed = spec.timed or spec.stop_at is not None
        self.steps, self.evals, self.train, self.train_s = [0], [], [], [0.0]
        self.limit = max(spec.horizon, spec.extend_to or 0) if spec.goal is not None else spec.horizon

    def wrap(self, optimizer):
        """The model and optimizer the steps train through: the spec's strategy applied (a subclass may train
        another way, as a benchmark of ``strategy="auto"`` does)."""
        from autosync.executor.apply import apply

        return apply(self.model, optimizer, self.strategy, init_sync=False)

    def release(self) -> None:
        from autosync.executor.apply import release

        release(self.ddp)

    def run(self) -> dict[str, Any]:
        import torch.distributed as dist

        from autosync.executor.device import now

        try:
            dist.barrier()
            self.evals.append(self.evaluate())
            self.clock = now(self.device)
            if self.timed and self.strategy.sync.kind.asynchronous:
                self.train_in_windows()
            else:
                self.train_in_steps()
        finally:
            self.release()
        signals = {k: float(statistics.fmean(v)) for k, v in self.sig.items() if v}
        return {"steps": self.steps, "eval_loss": self.evals, "train_loss": self.train, "signals": signals,
                "wall_s": time.monotonic() - self.t0, "train_s": self.train_s}

    # --- when to stop ------------------------------------------------------------------------------
    def crossed(self, goal: float | None) -> bool:
        """Whether the smoothed curve crossed ``goal``, confirmed by the evaluation after the crossing."""
        n = steps_to(self.steps, self.evals, goal) if goal is not None else None
        return n is not None and n <= self.steps[-2]

    def extending(self) -> bool:
        """Past the horizon: whether to train on. Not when the curve up to the horizon reached ``goal`` (even
        unconfirmed: the comparison reads that curve first), else until the crossing is confirmed or ``limit``."""
        spec = self.spec
        return (spec.goal is not None and self.steps[-1] < self.limit and not self.crossed(spec.goal)
                and steps_by(self.steps, self.evals, spec.goal, spec.horizon) is None)

    def timed_stop(self) -> bool:
        """Timed mode: every rank holds the same reduced losses, so the crossing is decided the same everywhere; the
        time cap is each rank's own clock, so it is decided by the slowest rank's (all-reduced): ranks whose clocks
        straddle the cap would otherwise part, one stopping while the other waits in the next step's collective
        (seen on a half-speed host)."""
        import torch
        import torch.distributed as dist

        if self.crossed(self.spec.stop_at):
            return True
        if not self.spec.max_train_s:
            return False
        over = torch.tensor([float(self.train_s[-1] > self.spec.max_train_s)], device=self.device)
        dist.all_reduce(over, op=dist.ReduceOp.MAX)
        return bool(over.item())

    # --- training ----------------------------------------------------------------------------------
    def evaluate(self) -> float:
        """The consensus model's (the ranks' parameters averaged) mean loss over the held-out set."""
        import copy

        import torch
        import torch.distributed as dist

        if self.consensus is None:
            self.consensus = copy.deepcopy(self.model)
        with torch.no_grad():
            for c, p in zip(self.consensus.parameters(), self.model.parameters()):
                c.copy_(p)
                dist.all_reduce(c.data)
                c.div_(self.world)
            total = torch.tensor([sum(float(self.workloads.loss_of(self.consensus(**b))) for b in self.mine)],
                                 dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return total.item() / self.n_eval

    def train_in_windows(self) -> None:
        """An asynchronous mode (asp) in timed mode trains in windows of wall-clock time, not of steps, so that fast
        ranks take more steps than slow ones between evaluations, as they would in a real run; the first window
        is eval_every steps and sets the length of the rest. Steps = the ranks' total / W (bsp-equivalent)."""
        from autosync.executor.device import now, reduce_values, to_device

        spec, device, window = self.spec, self.device, None
        while self.steps[-1] < spec.horizon or self.extending():
            n, start = 0, now(device)
            while n < spec.eval_every if window is None else now(device) - start < window:
                loss = self.workloads.loss_of(self.ddp(**to_device(self.make_batch(spec.batch_size, self.gen), device)))
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                self.train.append(loss.item())
                n += 1
            taken = reduce_values([float(n)], "sum", device)[0]
            longest = reduce_values([now(device) - start], "max", device)[0]
            window = window or longest
            self.train_s.append(self.train_s[-1] + longest)
            self.steps.append(self.steps[-1] + taken / self.world)
            self.evals.append(self.evaluate())
            if self.timed_stop():
                break

    def train_in_steps(self) -> None:
        import torch.distributed as dist

        from autosync.executor.device import now, to_device

        spec, device = self.spec, self.device
        for step in range(1, self.limit + 1):
            if step > spec.horizon and not self.extending():
                break
            batch = to_device(self.make_batch(spec.batch_size, self.gen), device)
            signal_step = spec.signals and not self.timed and step % spec.eval_every == 0 and step <= spec.horizon
            mean = self.noise_scale_signal(batch) if signal_step else None
            loss = self.workloads.loss_of(self.ddp(**batch))
            loss.backward()
            if signal_step:
                self.error_signal(mean)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
            lt = loss.detach().double().reshape(1)
            if not self.timed:
                dist.all_reduce(lt)
            self.train.append(lt.item() / (1 if self.timed else self.world))
            if signal_step and self.strategy.sync.kind.lossy:
                self.drift_signal()
            if step % spec.eval_every == 0 or step in (spec.horizon, self.limit):
                self.train_s.append(self.train_s[-1] + now(device) - self.clock)
                self.steps.append(step)
                self.evals.append(self.evaluate())
                self.clock = now(device)
                if self.timed and self.timed_stop():
                    break

    # --- signals -----------------------------------------------------------------------------------
    def noise_scale_signal(self, batch):
        """Before the step: every rank's local gradient of ``batch`` (no sync) and their exact mean; records the
        gradient noise scale ``B_simple`` from them. Returns the mean."""
        import torch
        import torch.distributed as dist

        with self.ddp.no_sync():
            self.workloads.loss_of(self.ddp(**batch)).backward()
        local = _flat_grads(self.params)
        self.optimizer.zero_grad(set_to_none=False)
        mean = local.clone()
        dist.all_reduce(mean)
        mean /= self.world
        sq = torch.tensor([float(local.pow(2).sum())], dtype=torch.float64, device=self.device)
        dist.all_reduce(sq)
        small, big = sq.item() / self.world, float(mean.pow(2).sum())
        b, bb = self.spec.batch_size, self.spec.batch_size * self.world
        g2 = (bb * big - b * small) / (bb - b)
        s_tr = (small - big) / (1 / b - 1 / bb)
        if self.world > 1 and g2 > 0:
            self.sig["grad_noise_scale"].append(s_tr / g2)
        return mean

    def error_signal(self, mean) -> None:
        """After the strategy's backward: the applied gradient's relative error against ``mean``, and the
        error-feedback residual's norm, averaged over the ranks."""
        import torch
        import torch.distributed as dist

        applied = _flat_grads(self.params)
        err = torch.tensor([float((applied - mean).norm()) / max(float(mean.norm()), 1e-30),
                            self.ddp.autosync_state.error_norm()], dtype=torch.float64, device=self.device)
        dist.all_reduce(err)
        self.sig["grad_error"].append(err[0].item() / self.world)
        self.sig["ef_norm"].append(err[1].item() / self.world)

    def drift_signal(self) -> None:
        """After the step of a lossy sync mode: how far the ranks' parameters are from their mean."""
        import torch
        import torch.distributed as dist

        flat = torch.cat([p.detach().reshape(-1).double() for p in self.params])
        avg = flat.clone()
        dist.all_reduce(avg)
        avg /= self.world
        dev = torch.tensor([float((flat - avg).pow(2).sum())], dtype=torch.float64, device=self.device)
        dist.all_reduce(dev)
        self.sig["local_drift"].append(math.sqrt(dev.item() / self.world) / max(float(avg.norm()), 1e-30))


def measure_curve(pool, spec: CurveSpec, timeout: float = 1800.0) -> Curve:
    """Run one curve on the pool's ranks; raises TrialFailure when a rank fails or the limit runs out."""
    raw = pool.run(train_curve, spec, timeout=timeout)[0]
    return Curve(raw["steps"], raw["eval_loss"], raw["train_loss"], raw["signals"], raw["wall_s"], raw["train_s"])


