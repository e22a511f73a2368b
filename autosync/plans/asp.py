"""``asp``: an asynchronous parameter server (Downpour-style); a straggler slows only itself.

Rank 0 of the process group keeps the master copy of the parameters and serves them from a
thread; every rank (rank 0 too) is a worker that trains on its own gradients and, after each
optimizer step, exchanges with the server without waiting for the other workers::

    worker r:  delta = theta_r - base_r;  push (delta, version of base_r);  pull theta_master -> theta_r = base_r
    server:    theta_master += delta / W;  version += 1;  staleness = version - version of base_r

so with every worker at the same pace and no staleness, one round of ``W`` pushes moves the master
by the mean of the workers' updates, as one bsp step does; a worker that is twice as fast pushes
twice as often. Each push's staleness (how many other pushes the master took since the worker last
pulled) is recorded (:attr:`AsyncParameterServer.staleness`). Gradients stay local (no collective in
backward); the traffic is point-to-point on a gloo group of CPU tensors, because the server
receives from whichever worker comes first and NCCL has no receive-from-any-source. When training
ends (:meth:`AsyncParameterServer.finish`) every worker says so, the server stops, and the master
is broadcast so that all ranks end with the same parameters. ::

    bucket cost = 0                                                          lossy (stale, timing-dependent)
    step cost  += 2 max(1, W - 1) t_sr(M)   (push and pull of the model M through the server's link)

Not with ZeRO. Its statistical efficiency depends on timing, so it is measured on the cluster
itself (time-based evaluation windows; :func:`autosync.efficiency.train.train_curve`), not on loopback.
"""
from __future__ import annotations

from autosync.plans.base import SyncModeDef


class AsyncParameterServer:
    """The server (on group rank 0, a thread) and this rank's worker side. Build on every rank, in order."""

    def __init__(self, params, process_group=None):
        import threading

        import torch.distributed as dist

        self.params = [p for p in params if p.requires_grad]
        pg = process_group if process_group is not None else dist.group.WORLD
        self.group = dist.new_group(dist.get_process_group_ranks(pg), backend="gloo")
        self.rank, self.world = dist.get_rank(pg), dist.get_world_size(pg)
        self.server = dist.get_global_rank(pg, 0) if pg is not dist.group.WORLD else 0
        self.n = sum(p.numel() for p in self.params)
        self.base = self._flat()
        self.base_version = 0
        self.staleness: list[float] = []
        self.pushes = 0
        self._finished = False
        if self.rank == 0:
            self.master = self.base.clone()
            self.version = 0
            self.lock = threading.Lock()
            self.served = 0
            self._error: BaseException | None = None
            self.thread = threading.Thread(target=self._serve, name="autosync-asp-server", daemon=True)
            self.thread.start()

    def _flat(self):
        import torch

        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params])

    def _load(self, flat) -> None:
        import torch

        offset = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                p.copy_(flat[offset:offset + k].view_as(p))
                offset += k

    def _apply(self, delta, base_version: float) -> float:
        """Server side: fold one push into the master (under the lock); its staleness."""
        stale = float(self.version - int(base_version))
        self.master.add_(delta, alpha=1.0 / self.world)
        self.version += 1
        return stale

    def _serve(self) -> None:
        import torch
        import torch.distributed as dist

        buf = torch.empty(self.n + 1)
        done = 0
        try:
            while done < self.world - 1:
                src = dist.recv(buf, group=self.group)          # whichever worker pushes first
                if buf[self.n] < 0:
                    done += 1
                    continue
                with self.lock:
                    stale = self._apply(buf[:self.n], float(buf[self.n]))
                    reply = torch.cat([self.master, torch.tensor([float(self.version), stale])])
                self.served += 1
                dist.send(reply, dst=src, group=self.group)
        except BaseException as e:  # noqa: BLE001 - raised on this rank's next exchange
            self._error = e

    def exchange(self) -> None:
        """Push this rank's update since its last pull; pull the master. Called after every optimizer step."""
        import torch
        import torch.distributed as dist

        delta = self._flat() - self.base
        if self.rank == 0:
            if self._error is not None:
                raise RuntimeError(f"asp server failed: {self._error}")
            with self.lock:
                stale = self._apply(delta, self.base_version)
                new, version = self.master.clone(), self.version
        else:
            dist.send(torch.cat([delta, torch.tensor([float(self.base_version)])]), dst=self.server, group=self.group)
            reply = torch.empty(self.n + 2)
            dist.recv(reply, src=self.server, group=self.group)
            new, version, stale = reply[:self.n], int(reply[self.n]), float(reply[self.n + 1])
        self.staleness.append(stale)
        self.pushes += 1
        self._load(new)
        self.base, self.base_version = new, version

    def finish(self) -> None:
        """End of training: stop the server, give every rank the master's parameters, free the group."""
        import torch
        import torch.distributed as dist

        if self._finished:
            return
        self._finished = True
        if self.rank == 0:
            self.thread.join()
            final = self.master
        else:
            dist.send(torch.cat([torch.zeros(self.n), torch.tensor([-1.0])]), dst=self.server, group=self.group)
            final = torch.empty(self.n)
        dist.broadcast(final, src=self.server, group=self.group)
        self._load(final)
        dist.destroy_process_group(self.group)


class _AsyncOptimizer:
    """The user's optimizer, followed by an exchange with the parameter server after every step."""

    def __init__(self, optimizer, server: AsyncParameterServer):
        self.optim, self.server = optimizer, server
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = optimizer.state

    def step(self, closure=None):
        out = self.optim.step(closure) if closure is not None else self.optim.step()
        self.server.exchange()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optim.load_state_dict(state_dict)

    def finish(self) -> None:
        self.server.finish()


class AsynchronousParameterServer(SyncModeDef):
    name = "asp"
    lossy = True
    allows_zero = False
    bypasses_plans = True
    asynchronous = True
    wraps_optimizer = True
    same_step = False
    features = {"asp": 0.0}

    def local_step(self, comm, iteration: int, sync) -> bool:
        return True

    def run_local(self, comm, buffer) -> None:
        """Nothing: each worker applies its own gradient; the server exchange follows the optimizer step."""

    def window(self, sync) -> float:
        return 1e9

    def wrap_optimizer(self, optimizer, sync, process_group):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return _AsyncOptimizer(optimizer, AsyncParameterServer(params, process_group))

    def bucket_cost(self, sim, nbytes: float, sync=None) -> float | None:
        return 0.0

    def step_cost(self, sim, sync, model_bytes: float) -> float:
        return 2 * max(1, sim.world - 1) * sim.t("send_recv", model_bytes)

    def sync_features(self, sync) -> dict[str, float]:
        return {"asp": 1.0}


MODE = AsynchronousParameterServer()
