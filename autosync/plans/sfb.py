"""``sfb``: sufficient-factor broadcasting (Poseidon), exact, for fully connected layers.

A fully connected layer ``y = x W^T + b`` (``W``: M x N) seen by ``K`` rows in a step (the batch; for a
transformer, batch x sequence; a layer applied twice sees its rows twice) has the weight gradient

    grad W = G^T X          G: K x M, the gradient of y;  X: K x N, the layer's input

so the sum over ranks is ``[G_1; ...; G_W]^T [X_1; ...; X_W]``. Instead of reducing the M x N matrix,
every rank all-gathers the factors (K x (M + N) numbers each) and forms the sum itself. The result is
the same sum as DDP's (to float rounding: one matmul instead of W partial ones). For a layer whose
weight is stored transposed (``transformers``' ``Conv1D``, GPT-2: ``y = x W + b``, ``W``: N x M) the
gradient is ``X^T G``, formed the same way. The layer's bias and every other parameter of the group are
all-reduced (one all-reduce per segment).

Which weights: those of ``nn.Linear`` and ``Conv1D`` modules that own them alone (not tied to another
module) -- :func:`factor_layers`. Module hooks capture X (forward) and G (a hook on the output) of
every use since the weight's last synchronization (every micro-batch under ``no_sync``), paired by use.
The first synchronization checks on every rank that the captured factors reproduce the local gradient;
a weight whose gradient has other terms (its module bypassed, as ``nn.MultiheadAttention`` does with
``out_proj``, or its output changed in place) is all-reduced from then on, on every rank alike, with one
warning line. So the plan is exact for any model.

Traffic (Poseidon's rule): an all-reduce moves about ``2 M N (W-1)/W`` numbers per rank, SFB
``K (M + N) (W-1)``; with S parameter servers SFB wins when ``2K(W-1)(M+N) <= 2MN(S+W-2)/S``. It wins
on wide layers with small batches and loses on transformer blocks with many tokens. It also costs
``2 M N W K`` flops per weight to form the sum on every rank. Simulator::

    cost = t_ag(8 W) + t_ag(W K (M + N) e) + 2 M N W K / flop_rate + t_ar(rest of the segment)

Memory: each weight keeps its K x (M + N) factors from its forward until its bucket is synchronized
(X is mostly the tensor autograd saves anyway; G is new), and W times as many while the sum is formed.

Needs the factors of the step it sums, so it is refused under a delayed (ssp) or asynchronous (asp)
mode; it takes no compressor (it sends factors, not the gradient).
"""
from __future__ import annotations

import logging
import math

from autosync.plans.base import PlanDef

log = logging.getLogger(__name__)


def factor_layers(model) -> list[tuple[str, object, bool]]:
    """``(weight name, module, transposed)`` of every weight whose gradient is a sum of outer products of
    its module's input and output gradient rows: ``nn.Linear`` (``transposed`` False) and ``transformers``'
    ``Conv1D`` (True), when the weight belongs to that one module (a tied weight gets other gradients)."""
    import torch.nn as nn

    owners: dict[int, int] = {}
    for _, mod in model.named_modules(remove_duplicate=False):
        for p in mod.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    out = []
    for name, mod in model.named_modules():
        transposed = type(mod).__name__ == "Conv1D" and hasattr(mod, "nf")
        if not (type(mod) is nn.Linear or transposed):
            continue
        w = getattr(mod, "weight", None)
        if w is None or not w.requires_grad or w.dim() != 2 or owners.get(id(w)) != 1:
            continue
        out.append((f"{name}.weight" if name else "weight", mod, transposed))
    return out


def poseidon_rule(shape, rows: float, world: int, servers: int | None = None) -> bool:
    """Whether SFB moves no more data than the parameter servers it replaces (Poseidon's rule)::

        2 K (W-1) (M+N) <= 2 M N (S+W-2) / S        (K rows, W workers, S servers; S = W by default,
                                                       every rank a server: a ring all-reduce's traffic)
    """
    if rows <= 0 or world < 2 or len(shape) != 2:
        return False
    m, n = shape
    s = servers or world
    return 2 * rows * (world - 1) * (m + n) <= 2 * m * n * (s + world - 2) / s


def outer_sum(g, x, transposed: bool):
    """``G^T X`` (``X^T G`` for a transposed weight): the weight gradient of rows ``g``, ``x``."""
    return x.t() @ g if transposed else g.t() @ x


class Factors:
    """The factors of the sfb weights of one group on one rank, captured by module hooks."""

    def __init__(self, model, param_ids: set[int]):
        self.names: dict[int, str] = {}
        self.transposed: dict[int, bool] = {}
        self.uses: dict[int, list[list]] = {}           # weight id -> [[X, G or None], ...] since its last sync
        self.exact: dict[int, bool] = {}                # decided at its first synchronization
        self._handles = []
        for name, mod, transposed in factor_layers(model):
            pid = id(mod.weight)
            if pid not in param_ids:
                continue
            self.names[pid], self.transposed[pid], self.uses[pid] = name, transposed, []
            self._handles.append(mod.register_forward_hook(self._forward_hook(pid)))

    def _forward_hook(self, pid: int):
        import torch

        def hook(module, args, output):
            if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad):
                return
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return
            use = [x.detach().reshape(-1, x.shape[-1]), None]
            self.uses[pid].append(use)

            def grad_hook(g, use=use):
                use[1] = g.detach().reshape(-1, g.shape[-1])
            output.register_hook(grad_hook)
        return hook

    def take(self, pid: int):
        """``(X, G)`` of every use of weight ``pid`` since its last synchronization (rows stacked), or None
        when it has none with a gradient; forgets them."""
        import torch

        uses = [(x, g) for x, g in self.uses.get(pid, ()) if g is not None]
        self.uses[pid] = []
        if not uses:
            return None
        return torch.cat([x for x, _ in uses]), torch.cat([g for _, g in uses])

    def forget(self) -> None:
        """Drop every captured factor (a step whose buckets did not go through the plans)."""
        for pid in self.uses:
            self.uses[pid] = []

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.forget()


class SufficientFactors(PlanDef):
    name = "sfb"
    features = {"frac_plan_sfb": 0.0}
    compressible = False
    immediate = True

    def offered(self, params) -> bool:
        return any(getattr(p, "factor_rows", 0.0) > 0 for p in params)

    def make_state(self, comm, model, params) -> Factors:
        return Factors(model, {id(p) for p in params})

    def end_step(self, state: Factors) -> None:
        state.forget()

    def close_state(self, state: Factors) -> None:
        state.close()

    def run(self, comm, t, seg, owners) -> None:
        import torch
        import torch.distributed as dist

        from autosync.plans._torch import all_gather

        state: Factors = comm.plan_states[seg.group]
        dense: list[tuple[int, int]] = []
        factored: list[tuple[int, int, int, object, object]] = []   # (offset, numel, pid, X, G)
        for (off, numel, shape), pid in zip(seg.shapes, seg.key):
            if pid in state.names and state.exact.get(pid, True):
                got = state.take(pid)
                x, g = got if got is not None else (t.new_zeros(0, shape[0 if state.transposed[pid] else 1]),
                                                    t.new_zeros(0, shape[1 if state.transposed[pid] else 0]))
                factored.append((off, numel, pid, x.to(t.dtype), g.to(t.dtype)))
            else:
                dense.append((off, numel))
        fresh = [i for i, (_, _, pid, _, _) in enumerate(factored) if pid not in state.exact]
        if fresh:   # first synchronization of these weights: do the factors give the local gradient? (all ranks)
            ok = torch.tensor([float(_matches(outer_sum(factored[i][4], factored[i][3], state.transposed[factored[i][2]]),
                                              t[factored[i][0]:factored[i][0] + factored[i][1]])) for i in fresh],
                              device=t.device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=comm.pg)
            for i, good in zip(fresh, ok.tolist()):
                pid = factored[i][2]
                state.exact[pid] = bool(good)
                if not good:
                    log.warning("sfb: the gradient of %s is not the product of its layer's input and output "
                                "gradient (the layer is bypassed or its output changed in place); all-reducing it",
                                state.names[pid])
            dense += [(off, numel) for off, numel, pid, _, _ in factored if not state.exact[pid]]
            factored = [f for f in factored if state.exact[f[2]]]
        if dense:
            flat = torch.cat([t[o:o + n] for o, n in dense]) if len(dense) > 1 else t[dense[0][0]:sum(dense[0])]
            dist.all_reduce(flat, group=comm.pg)
            if len(dense) > 1:
                pos = 0
                for o, n in dense:
                    t[o:o + n].copy_(flat[pos:pos + n])
                    pos += n
        if not factored:
            return
        rows = torch.tensor([f[3].shape[0] for f in factored], dtype=torch.long, device=t.device)
        all_rows = torch.empty(comm.world * len(factored), dtype=torch.long, device=t.device)
        all_gather(all_rows, rows, group=comm.pg)
        all_rows = all_rows.view(comm.world, len(factored)).tolist()
        widths = [f[3].shape[1] + f[4].shape[1] for f in factored]
        sizes = [sum(r * w for r, w in zip(rr, widths)) for rr in all_rows]
        send = torch.zeros(max(sizes), dtype=t.dtype, device=t.device)
        pos = 0
        for _, _, _, x, g in factored:
            for part in (x, g):
                send[pos:pos + part.numel()] = part.reshape(-1)
                pos += part.numel()
        gathered = torch.empty(comm.world * send.numel(), dtype=t.dtype, device=t.device)
        all_gather(gathered, send, group=comm.pg)
        gathered = gathered.view(comm.world, -1)
        xs: list[list] = [[] for _ in factored]
        gs: list[list] = [[] for _ in factored]
        for r in range(comm.world):
            pos = 0
            for i, (_, _, _, x, g) in enumerate(factored):
                k = all_rows[r][i]
                xs[i].append(gathered[r, pos:pos + k * x.shape[1]].view(k, x.shape[1]))
                pos += k * x.shape[1]
                gs[i].append(gathered[r, pos:pos + k * g.shape[1]].view(k, g.shape[1]))
                pos += k * g.shape[1]
        for i, (off, numel, pid, _, _) in enumerate(factored):
            total = outer_sum(torch.cat(gs[i]), torch.cat(xs[i]), state.transposed[pid])
            t[off:off + numel].copy_(total.reshape(-1))

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()) -> float:
        rows = list(rows) or [0.0] * len(shapes)
        dense = sum(math.prod(s) for s, k in zip(shapes, rows) if not k) * elem_size
        factors = [(s, k) for s, k in zip(shapes, rows) if k]
        total = sim.t("all_reduce", dense)
        if factors:
            total += sim.t("all_gather", 8 * sim.world * len(factors))
            total += sim.t("all_gather", sim.world * sum(k * (s[0] + s[1]) for s, k in factors) * elem_size)
            total += sum(2.0 * s[0] * s[1] * sim.world * k for s, k in factors) / max(sim.flop_rate, 1.0)
        return total

    def traffic(self, nbytes, shapes, rows, elem_size, world) -> float:
        """Bytes this rank sends for the segment: its factors to each peer, the rest by all-reduce."""
        rows = list(rows) or [0.0] * len(shapes)
        dense = sum(math.prod(s) for s, k in zip(shapes, rows) if not k) * elem_size
        return dense + sum(k * (s[0] + s[1]) for s, k in zip(shapes, rows) if k) * elem_size * (world - 1)


def _matches(recon, grad) -> bool:
    """Whether ``recon`` (the factors' product) equals the local gradient ``grad`` to float rounding."""
    import torch

    if recon.numel() != grad.numel():
        return False
    grad = grad.reshape(recon.shape)
    scale = float(grad.abs().max()) if grad.numel() else 0.0
    return bool(torch.allclose(recon, grad, rtol=1e-4, atol=1e-5 * scale + 1e-12))


PLAN = SufficientFactors()
