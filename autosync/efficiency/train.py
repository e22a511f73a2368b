"""The rank side of the efficiency protocol (:mod:`autosync.efficiency`): paired training runs on real ranks."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

from autosync.efficiency import EVAL_SAMPLES, EVAL_SEED, Curve, CurveSpec, smooth, steps_to
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
    import torch
    import torch.distributed as dist

    from autosync import workloads
    from autosync.executor.apply import apply, release
    from autosync.executor.device import now, reduce_values, to_device
    from autosync.executor.recipe import data_generator, make_optimizer

    t0 = time.monotonic()
    device = ctx.device
    strategy = Strategy.from_dict(spec.strategy)
    model, make_batch = workloads.build(spec.workload, seed=spec.seed)
    model.to(device)
    optimizer = make_optimizer(spec.optimizer, spec.lr, model.parameters())
    ddp, optimizer = apply(model, optimizer, strategy, init_sync=False)
    params = [p for p in model.parameters() if p.requires_grad]
    world = ctx.world_size
    gen = data_generator(spec.seed, ctx.rank)
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    n_eval = max(world, math.ceil(EVAL_SAMPLES / spec.batch_size))
    n_eval -= n_eval % world
    eval_batches = [to_device(make_batch(spec.batch_size, eval_gen), device) for _ in range(n_eval)]
    mine = eval_batches[ctx.rank::world]
    consensus = None
    sig: dict[str, list[float]] = {"grad_error": [], "ef_norm": [], "local_drift": [], "grad_noise_scale": []}

    def evaluate() -> float:
        nonlocal consensus
        import copy

        if consensus is None:
            consensus = copy.deepcopy(model)
        with torch.no_grad():
            for c, p in zip(consensus.parameters(), model.parameters()):
                c.copy_(p)
                dist.all_reduce(c.data)
                c.div_(world)
            total = torch.tensor([sum(float(workloads.loss_of(consensus(**b))) for b in mine)], dtype=torch.float64,
                                 device=device)
        dist.all_reduce(total)
        return total.item() / n_eval

    timed = spec.timed or spec.stop_at is not None
    steps, evals, train, train_s = [0], [], [], [0.0]

    def crossed(goal: float | None) -> bool:
        """Whether the smoothed curve crossed ``goal``, confirmed by the evaluation after the crossing."""
        n = steps_to(steps, evals, goal) if goal is not None else None
        return n is not None and n <= steps[-2]

    limit = max(spec.horizon, spec.extend_to or 0) if spec.goal is not None else spec.horizon

    def extending() -> bool:
        """Past the horizon: whether to train on. Not when the curve up to the horizon reached ``goal`` (even
        unconfirmed: the comparison reads that curve first), else until the crossing is confirmed or ``limit``."""
        return (spec.goal is not None and steps[-1] < limit and not crossed(spec.goal)
                and steps_by(steps, evals, spec.goal, spec.horizon) is None)

    try:
        dist.barrier()
        evals.append(evaluate())
        clock = now(device)
        # An asynchronous mode (asp) in timed mode trains in windows of wall-clock time, not of steps, so that fast
        # ranks take more steps than slow ones between evaluations, as they would in a real run; the first window
        # is eval_every steps and sets the length of the rest. Steps = the ranks' total / W (bsp-equivalent).
        async_timed = timed and strategy.sync.kind.asynchronous
        window = None
        while async_timed and (steps[-1] < spec.horizon or extending()):
            n, start = 0, now(device)
            while n < spec.eval_every if window is None else now(device) - start < window:
                batch = to_device(make_batch(spec.batch_size, gen), device)
                loss = workloads.loss_of(ddp(**batch))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
                train.append(loss.item())
                n += 1
            elapsed = now(device) - start
            taken = reduce_values([float(n)], "sum", device)[0]
            longest = reduce_values([elapsed], "max", device)[0]
            window = window or longest
            train_s.append(train_s[-1] + longest)
            steps.append(steps[-1] + taken / world)
            evals.append(evaluate())
            if crossed(spec.stop_at) or (spec.max_train_s and train_s[-1] > spec.max_train_s):
                break
        for step in range(1, 0 if async_timed else limit + 1):
            if step > spec.horizon and not extending():
                break
            batch = to_device(make_batch(spec.batch_size, gen), device)
            signal_step = spec.signals and not timed and step % spec.eval_every == 0 and step <= spec.horizon
            if signal_step:
                with ddp.no_sync():
                    workloads.loss_of(ddp(**batch)).backward()
                local = _flat_grads(params)
                optimizer.zero_grad(set_to_none=False)
                mean = local.clone()
                dist.all_reduce(mean)
                mean /= world
                sq = torch.tensor([float(local.pow(2).sum())], dtype=torch.float64, device=device)
                dist.all_reduce(sq)
                small, big = sq.item() / world, float(mean.pow(2).sum())
                b, bb = spec.batch_size, spec.batch_size * world
                g2 = (bb * big - b * small) / (bb - b)
                s_tr = (small - big) / (1 / b - 1 / bb)
                if world > 1 and g2 > 0:
                    sig["grad_noise_scale"].append(s_tr / g2)
            loss = workloads.loss_of(ddp(**batch))
            loss.backward()
            if signal_step:
                applied = _flat_grads(params)
                err = torch.tensor([float((applied - mean).norm()) / max(float(mean.norm()), 1e-30),
                                    ddp.autosync_state.error_norm()], dtype=torch.float64, device=device)
                dist.all_reduce(err)
                sig["grad_error"].append(err[0].item() / world)
                sig["ef_norm"].append(err[1].item() / world)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            lt = loss.detach().double().reshape(1)
            if not timed:
                dist.all_reduce(lt)
            train.append(lt.item() / (1 if timed else world))
            if signal_step and strategy.sync.kind.lossy:
                flat = torch.cat([p.detach().reshape(-1).double() for p in params])
                avg = flat.clone()
                dist.all_reduce(avg)
                avg /= world
                dev = torch.tensor([float((flat - avg).pow(2).sum())], dtype=torch.float64, device=device)
                dist.all_reduce(dev)
                sig["local_drift"].append(math.sqrt(dev.item() / world) / max(float(avg.norm()), 1e-30))
            if step % spec.eval_every == 0 or step in (spec.horizon, limit):
                train_s.append(train_s[-1] + now(device) - clock)
                steps.append(step)
                evals.append(evaluate())
                clock = now(device)
                if timed:
                    # every rank holds the same reduced losses: the decision is the same everywhere
                    if crossed(spec.stop_at) or (spec.max_train_s and train_s[-1] > spec.max_train_s):
                        break
    finally:
        release(ddp)
    signals = {k: float(statistics.fmean(v)) for k, v in sig.items() if v}
    return {"steps": steps, "eval_loss": evals, "train_loss": train, "signals": signals,
            "wall_s": time.monotonic() - t0, "train_s": train_s}


def measure_curve(pool, spec: CurveSpec, timeout: float = 1800.0) -> Curve:
    """Run one curve on the pool's ranks; raises TrialFailure when a rank fails or the limit runs out."""
    raw = pool.run(train_curve, spec, timeout=timeout)[0]
    return Curve(raw["steps"], raw["eval_loss"], raw["train_loss"], raw["signals"], raw["wall_s"], raw["train_s"])


