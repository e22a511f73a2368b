"""Tune while you train: the search runs in windows of the user's own training steps.

Every step the tuner sees trains the model; it only chooses which strategy the next steps run by. The timeline,
on every rank at the same steps (decisions are rank 0's, broadcast at the end of each window)::

    default window(s)  ->  network bench + profile  ->  candidate windows  ->  commit (the rest of the training)
                           (rank 0 predicts in a background thread while the default keeps training)

1. **Default window**: the strategy the training starts with (the DDP default) runs ``settle`` steps, at most 2
   (DDP builds its buckets at the second), and half a window of timed steps (``window // 2``, at least 4: on a slow network
   every default step is the one a candidate would most shorten); a
   :class:`~autosync.profiler.observe.StepObserver` records them. At its end every rank runs a short sweep of
   collectives (:func:`network_here`) and rank 0 builds the :class:`~autosync.profiler.Profile` and starts
   ``propose(profile)`` in a thread. Until it answers, the default keeps training (in windows of half the size,
   for at most ``max_wait_s``), and after each of its steps every rank learns from rank 0 (one one-number
   all-reduce) whether the answer is in: the first candidate starts at the next step. A window of the strategy
   already training (the default going on, the incumbent between candidates) settles nothing: it times from its
   first step.
2. **Candidate windows**: each proposed strategy (only those the switcher can train: synchronous modes, and with
   :func:`autosync.apply`'s switcher the local modes too, :mod:`autosync.executor.switch`) trains ``settle +
   window`` steps. A window's figure is the slowest rank's median step time; its spread, the slowest rank's
   interquartile range over that median. A local mode (local SGD, DiLoCo: cheap steps and an averaging step every
   ``period``) times whole rounds (``window`` rounded up to its period, after its bsp warm-up; one switched to
   after the training's first steps starts past its warm-up and times from its first step); its figure counts
   the averaging inside the optimizer's step by its mean and the rest of the step by its median (:func:`figure`).
   The clock is the host's: on a GPU, kernels still running when the optimizer's step returns land in the next
   step's time. A candidate's *effective* step time is its median over its
   statistical efficiency: 1 for a lossless one, and for a lossy one (a compressor, a local mode) the
   efficiency model's prediction by the tuner's rule (``efficiency_rule``: ``"point"``, its point estimate, as
   ``tune --measure 0`` judges it; ``"lower"``, its interval's lower bound, so that a lossy candidate wins only
   if that pessimistic goodput beats the lossless ones); one proposed without it is not tried, and each lossy
   candidate trains one window only
   (what it does to convergence is predicted, not measured here). A candidate whose effective step is slower than
   the default's beyond the larger spread is dropped; a candidate that fails to build on any rank reverts every
   rank to the last strategy and is recorded as failed with its reason.
   Between candidates the fastest strategy measured so far (the *incumbent*) trains. A candidate that sends what a
   strategy measured in this search sends in the steps a window times (the same
   :meth:`~autosync.strategy.Strategy.steady_traffic_hash`: DiLoCo variants that differ only in their outer
   learning rate or momentum; with one rank per host, local modes that differ only in the plans and buckets of
   their warm-up steps) is not trained: it takes that one's step time, judged at its own efficiency.
3. **Budget**: exploring costs the time candidates lose against the incumbent, each timed or settling step of a
   candidate window counted at ``max(0, its median - the best's median)`` (wall-clock time). The next candidate starts only while that
   loss is at most ``budget`` (default 5%) of the training time observed so far; otherwise the incumbent trains
   on until the training has grown enough to pay for it. A winning candidate costs nothing, a lossless one that
   loses by 3% costs 3% of its window, and a candidate slower than the incumbent beyond noise is dropped after its
   one window. The one-time profiling (the network's short sweep of collectives) is not part of the budget; it
   is reported as ``overhead_s`` with the switches and decisions.
   **Young trainings** (``lossy_after``, default 0: off): a lossy candidate's window starts no earlier than that
   step of the training; before it, the lossless candidates are tried and the best so far trains on. A lossy stretch
   near a training's start can cost far more than its window: on vit-tiny one 8-step local SGD window at step 8,
   then DDP again, did not reach L* in 480 steps (seed 1; seed 2 took more than twice the default's steps), while
   the same window at step 24 did in both seeds (bench/results/lossy_window*.md): post-local SGD's rule.
4. **Commit**: the fastest measured (the default unless something beat it), for the rest of the training.
   ``on_commit(strategy, windows)`` runs on rank 0 (the API writes the strategy file there). A training that ends
   during the search commits what it measured so far (:meth:`OnlineTuner.finish`, called by ``release`` and the
   integrations' end of training).
5. **Drift**: after the commit every rank keeps timing its steps (a clock read per step; after a commit that
   switched, from the end of the new strategy's settling steps, so that a local mode's watch covers whole
   rounds); every ``2 * window`` steps the slowest rank's median is compared with the committed strategy's
   figure. When it is slower by more than ``drift`` (default 25%) or twice the committed windows' spread,
   whichever is larger, in ``3`` such windows in a row (a host slowed down, a straggler appeared), the
   search opens again: the default trains a window, then the candidates measured before, each once more (the
   budget applies), and the best commits again; at most ``max_reexplore`` times (default 2) in a training.

6. **Loss guard** (``guard``, default on): a lossy commit is judged by its predicted efficiency, and a prediction can
   be wrong by more than its interval: on vit-tiny, DiLoCo with the paper's outer momentum 0.9 committed at step 48
   stalled about 0.2 above the loss DDP reached, in both seeds, where DiLoCo without outer momentum matched DDP
   (bench/results/lossy_window.md). So after a lossy commit every rank keeps the training losses its model's
   forward returns (a scalar tensor or an output's ``.loss``, as autosync's workloads and Hugging Face models
   return it; :meth:`OnlineTuner.observe_loss` for a loop whose model returns logits) and, every block of
   ``guard_block`` steps (default 16; at least the strategy's round) from ``GUARD_BLOCKS`` blocks after the commit
   on, compares the ranks' mean loss over the last ``GUARD_BLOCKS`` blocks with their mean over as many steps
   before the commit. Not below it in two checks in a row (the training made no progress since the commit, or the
   loss went up or is not finite), the guard leaves the lossy strategy for the best lossless one measured (the
   default unless a lossless candidate beat it), commits that (``on_commit`` again: the strategy file says why)
   and does not try the stalled one again after a drift. On the vit-tiny curves above the rule fires 48 and 80
   steps after the m0.9 commit and never on DDP, local SGD or DiLoCo without momentum. A model whose forward
   returns no loss (and no ``observe_loss``) leaves the guard off. One loss number per block crosses ranks
   (an all-reduce of two numbers).

Lossless candidates leave the math unchanged, so the parameters after N steps equal plain DDP's to rounding
whichever candidates ran (``tests/test_online.py``); leaving a local mode for a synchronous one averages the
ranks' parameters and optimizer states, and a local mode switched to goes on past its warm-up from where the ranks
are (DiLoCo from the global copy the last one left; :mod:`autosync.executor.switch`). The API (:func:`autosync.api.auto_tuner`) writes the strategy
file and appends the windows to a dataset at the commit. Not yet: measuring a lossy candidate's efficiency during
the training (its online signals: it is predicted), and asp (each rank at its own pace, which windows that end
on the same step on every rank would undo).
"""
from __future__ import annotations

import collections
import logging
import math
import statistics
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from autosync.executor.switch import switchable
from autosync.strategy import Strategy

log = logging.getLogger(__name__)

#: candidates the cost model scores for a live search, as many as ``tune`` scores: rank 0 predicts in a thread beside
#: the training, whose steps it slows while it runs, and the default trains until it answers (alone here: 1.2 s for
#: 500, 0.4 s for 150 on gpt2-tiny at 1 gbit, where the best candidate TPE proposed was predicted 2.18x the
#: default's goodput after 500 proposals, 1.99x after 150)
PROPOSALS = 500

#: the loss guard's horizon, in blocks of ``guard_block`` steps: the mean loss over the last this many blocks after a
#: lossy commit is compared with the mean over as many steps before it
GUARD_BLOCKS = 2


@dataclass
class Window:
    """One window of training steps by one strategy."""

    strategy: Strategy
    source: str                      # "default", "predicted", "incumbent" (the best so far, between candidates)
    first_step: int
    steps_s: list[float] = field(default_factory=list)   # this rank's timed steps
    optimizer_s: list[float] = field(default_factory=list)   # the optimizer's step inside each (a local mode's)
    median_s: float | None = None    # the slowest rank's step time (median; a local mode's: mean of whole rounds)
    spread: float = 0.0              # the slowest rank's interquartile range / median
    outcome: str = ""                # measured, dropped: ..., failed: ...
    predicted_speedup: float | None = None
    efficiency: float = 1.0          # 1 for lossless; a lossy candidate's predicted efficiency (by the tuner's rule)
    busy: bool = False               # rank 0 predicted during it (its steps shared the CPU): not a figure
    sibling: str = ""                # not trained: the figure of this measured strategy of the same traffic (hash)
    epoch: int = 0                   # how many times the search had opened again when this window ran
    settle: int | None = None        # untimed steps at its start (None: the tuner's for its strategy)
    timed: int | None = None         # timed steps (None: the tuner's for its strategy)

    def as_dict(self) -> dict:
        return {"strategy": self.strategy.summary(), "hash": self.strategy.hash, "source": self.source,
                "first_step": self.first_step, "steps": len(self.steps_s), "median_step_s": self.median_s,
                "spread": self.spread, "outcome": self.outcome, "predicted_speedup": self.predicted_speedup,
                "efficiency": self.efficiency, "busy": self.busy, "epoch": self.epoch, "sibling": self.sibling}

    @property
    def effective_s(self) -> float | None:
        """The median step over the efficiency: seconds per lossless-equivalent step."""
        return None if self.median_s is None else self.median_s / self.efficiency


def _spread(xs: list[float]) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def round_of(strategy: Strategy) -> int:
    """Steps after which the strategy's pattern repeats (a local mode's period; 1 for bsp)."""
    return strategy.sync.kind.steps_per_round(strategy.sync)


def figure(strategy: Strategy, steps_s: list[float], optimizer_s: list[float] | None = None) -> tuple[float, float]:
    """(step time, spread) of a rank's timed steps: the median and the interquartile range over it. For a strategy
    whose pattern repeats every k > 1 steps (a local mode: cheap steps, and the averaging inside the optimizer's
    step every ``period``), over whole rounds, with ``optimizer_s`` the time of the optimizer's step inside each
    step (averaging included)::

        step = median_i(t_i - o_i) + mean_i(o_i)        spread = IQR / median of the rounds' times

    the averaging is counted exactly (a mean over whole rounds, as a trial's mean step,
    :func:`autosync.executor.measure.summarize`) while the rest of the step keeps the median's robustness: a
    training's evaluation or checkpoint between two steps would move a plain mean (one evaluation in a window of
    16 steps read a DiLoCo step 45% slow). Without ``optimizer_s``, the mean of the steps."""
    k = round_of(strategy)
    if k == 1:
        return statistics.median(steps_s), _spread(steps_s)
    rounds = [sum(steps_s[i:i + k]) for i in range(0, len(steps_s) - k + 1, k)]
    if not optimizer_s or len(optimizer_s) != len(steps_s):
        return statistics.fmean(steps_s), _spread(rounds)
    return (statistics.median(t - o for t, o in zip(steps_s, optimizer_s)) + statistics.fmean(optimizer_s),
            _spread(rounds))


def window_steps(strategy: Strategy, window: int, settle: int) -> tuple[int, int]:
    """(untimed, timed) steps of a window of ``strategy`` that switched in: ``settle``, and for a local mode its
    bsp warm-up and one more step; ``window``, rounded up to the strategy's whole rounds."""
    k = round_of(strategy)
    untimed = max(settle, getattr(strategy.sync, "warmup_steps", 0) + 1 if k > 1 else 0)
    return untimed, -(-window // k) * k


class _LossHook:
    """The loss guard's forward hook on the user's module. It holds its tuner weakly, and a copy of the module
    (``copy.deepcopy``, ``pickle``, ``torch.save`` of the whole model: an evaluation copy, a checkpoint) gets an
    inert one: a tuner holds process groups, which neither copies nor pickles."""

    def __init__(self, tuner=None):
        self.tuner = weakref.ref(tuner) if tuner is not None else None

    def __call__(self, module, args, output):
        tuner = self.tuner() if self.tuner is not None else None
        if tuner is not None:
            tuner._on_forward(module, args, output)

    def __reduce__(self):
        return _LossHook, ()


class OnlineTuner:
    """The tuner of a live training. ``switcher``: a :class:`~autosync.executor.switch.SwitchableModel` (a plain
    loop) or :class:`~autosync.executor.switch.SwitchableHook` (a framework's DDP); ``optimizer``: the torch
    optimizer whose steps are observed; whoever drives the training calls :meth:`after_step` after each optimizer
    step (a :class:`~autosync.executor.switch.SwitchableOptimizer`'s ``on_step``, a framework's callback)."""

    def __init__(self, switcher, optimizer, propose, *, window: int = 8,
                 settle: int = 3, max_candidates: int = 4, budget: float = 0.05, max_wait_s: float = 600.0,
                 drift: float = 0.25, max_reexplore: int = 2, ranks_per_host: int = 1, cluster=None,
                 env: dict | None = None, name: str = "model", on_commit=None, report=None,
                 efficiency_rule: str = "lower", lossy_after: int = 0, guard: bool = True, guard_block: int = 16):
        if window < 4:
            raise ValueError("window must be at least 4 steps (a median and a spread)")
        if not 0 < budget <= 1:
            raise ValueError("budget must be a share of the training time in (0, 1]")
        if lossy_after < 0:
            raise ValueError("lossy_after must be a step count (>= 0)")
        if guard_block < 4:
            raise ValueError("guard_block must be at least 4 steps")
        self.budget, self.drift, self.max_reexplore = budget, drift, max_reexplore
        self.lossy_after = lossy_after      # no lossy candidate's window starts before this step
        self.trained_s = 0.0         # the training steps' time observed so far (this rank)
        self.epoch = 0               # times the search opened again after a drift
        self.committed_s: float | None = None   # the committed strategy's step time when committed (rank 0's figure)
        self._watch: list[float] = []           # steps timed since the commit, for drift
        self._watch_opt: list[float] = []       # the optimizer's step inside each
        # the first step the watch times: after a commit that switched, the new strategy settles first (a local
        # mode's warm-up), so that each watch covers whole rounds and ends on an averaging step, as a window does
        self._watch_from = 0
        self._drifted = 0                       # watch windows in a row slower than committed_s beyond ``drift``
        self._lost_before = 0.0                 # time lost exploring in earlier epochs
        self.model, self.propose = switcher, propose
        self.window, self.settle, self.max_candidates = window, settle, max_candidates
        self.max_wait_s, self.rph, self.cluster, self.env = max_wait_s, ranks_per_host, cluster, env or {}
        self.name, self.on_commit, self.report = name, on_commit, report
        # what a lossy candidate's efficiency is (the predictions' rule: "lower", their interval's lower bound, or
        # "point", their point estimate), as the progress lines, the file and the report say it
        self.efficiency_rule = efficiency_rule
        self.rank = dist.get_rank()
        self.steps = 0
        self.windows: list[Window] = []
        # the first window: half a window (at least 4 timed steps), enough for the profile and the default's figure,
        # after at most 2 settling steps (DDP builds its buckets in the second; the observer times from the third)
        self.current = Window(switcher.strategy, "default", 0, settle=min(settle, 2), timed=self.half_window)
        # every rank: rank 0's prediction runs and has not answered (each step then asks whether it has, so that
        # the first candidate starts at the step after the answer)
        self._polling = False
        self.default_strategy, self.default_hash = switcher.strategy, switcher.strategy.hash
        self.queue: list[tuple[Strategy, float | None, float]] | None = None   # rank 0: (candidate, speedup, eff)
        self.proposal: dict = {}                                      # rank 0: the thread's answer
        self.thread: threading.Thread | None = None
        self.committed: Strategy | None = None
        self.committed_at: int | None = None   # the step of the last commit
        self.committed_spread = 0.0            # the committed strategy's windows' largest spread (rank 0's)
        self.committed_why = ""                # why the last commit chose what it did
        self.overhead_s = 0.0        # time spent outside training steps: benches, switches, decisions
        # what this rank waited in the first collective of a window's end or a drift check: the other ranks' steps
        # still running (a local mode lets a faster rank run ahead by up to a round), not overhead
        self.waited_s = 0.0
        # that time by part (this rank's): the model's profile, the network's collectives, the switches
        self.overhead_parts = {"profile": 0.0, "network": 0.0, "switch": 0.0}
        self.profile = None
        self._last: float | None = None
        self._asked: float | None = None      # rank 0: when the prediction started
        self._answered = -1                   # rank 0: the step during which it answered
        from autosync.profiler.observe import StepObserver

        self.observer: StepObserver | None = StepObserver(switcher.module, optimizer, name)
        # the loss guard (see the module's docstring): this step's training losses as the model's forward returned
        # them (detached, on the device), the last GUARD_BLOCKS blocks' step losses, the reference of a lossy commit
        self.guard, self.guard_block = guard, guard_block
        self._pending: list[torch.Tensor] = []
        self._recent: collections.deque = collections.deque(maxlen=GUARD_BLOCKS * guard_block)
        self._guard_ref: float | None = None    # the mean loss of the steps before the lossy commit (all ranks)
        self._guard_slow = 0                    # checks in a row whose loss was not below the reference
        self.stalled: set[str] = set()          # lossy strategies the guard left (not committed again)
        self.reverted: dict | None = None       # the last time the guard left a lossy strategy, and why
        self.losses_seen = 0                    # steps whose training loss the guard read (this rank)
        self._loss_hook = switcher.module.register_forward_hook(_LossHook(self)) if guard else None

    # --- every step -------------------------------------------------------------------------------
    def after_step(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.trained_s += now - self._last
        if self.committed is None and self._last is not None and \
                self.steps - self.current.first_step >= self._settle(self.current):
            self.current.steps_s.append(now - self._last)
            self.current.optimizer_s.append(self._optimizer_s())
        elif self.committed is not None and self._last is not None and self.steps >= self._watch_from:
            self._watch.append(now - self._last)
            self._watch_opt.append(self._optimizer_s())
        self.steps += 1
        if self._pending:
            self._recent.append(torch.stack(self._pending).mean())
            self._pending = []
            self.losses_seen += 1
        if self.committed is None and len(self.current.steps_s) >= self._timed(self.current):
            self._outside(self._end_window)
        elif self._polling and self.committed is None and self.current.steps_s:
            self._outside(self._poll)
        elif self.committed is not None and len(self._watch) >= 2 * self.timed_of(self.committed):
            self._outside(self._check_drift)
        if self._guard_ref is not None and self.committed is not None and self._guard_due():
            self._outside(self._check_guard)
        self._last = time.perf_counter()

    # --- the loss guard -----------------------------------------------------------------------------
    def _on_forward(self, module, args, output) -> None:
        """Forward hook on the user's module: a training forward's scalar loss (the output, or its ``.loss``)."""
        if module.training and torch.is_grad_enabled():
            loss = getattr(output, "loss", output)
            if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point():
                self.observe_loss(loss)

    def observe_loss(self, loss) -> None:
        """The training loss of the step running now (a tensor or a number; several in one step are averaged): the
        loss guard's input. Called by the forward hook when the model returns its loss; a loop whose model returns
        something else (logits) may call it with the loss it computed, before the optimizer's step."""
        self._pending.append(loss.detach().float() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss)))

    def guard_words(self) -> str:
        """The loss guard's state, in words (the strategy file's line)."""
        if not self.guard:
            return "off (guard=False)"
        if not self.losses_seen:
            return ("off: the model's forward returned no scalar loss (a loop may hand it the loss: "
                    "observe_loss)")
        back = "" if self.reverted is None else \
            f"; at step {self.reverted['step']} it left {self.reverted['left_summary']}"
        return f"on: it read the training loss of {self.losses_seen} steps, and watches a lossy commit{back}"

    def _guard_block_of(self, strategy: Strategy) -> int:
        """The loss guard's block for ``strategy``: ``guard_block`` steps, at least its round."""
        return max(self.guard_block, round_of(strategy))

    def _guard_due(self) -> bool:
        since, block = self.steps - self.committed_at, self._guard_block_of(self.committed)
        return since >= GUARD_BLOCKS * block and since % block == 0

    def _mean_loss(self) -> float | None:
        """Collective: the ranks' mean of the step losses in ``_recent`` (None where no rank has any)."""
        total = float(torch.stack(list(self._recent)).double().sum()) if self._recent else 0.0
        out = self._all_reduce([total, float(len(self._recent))], dist.ReduceOp.SUM)
        return float(out[0] / out[1]) if out[1] > 0 else None

    def _arm_guard(self) -> None:
        """Collective, at a commit: a lossy commit arms the guard with the mean loss of the steps before it."""
        self._guard_slow, self._guard_ref = 0, None
        if self.guard and not self.committed.is_lossless:
            ref = self._mean_loss()
            self._guard_ref = ref if ref is not None and math.isfinite(ref) else None
        # from now on the last GUARD_BLOCKS blocks of the committed strategy (a block: at least its round)
        self._recent = collections.deque(self._recent, maxlen=GUARD_BLOCKS * self._guard_block_of(self.committed))

    def _check_guard(self) -> None:
        """Collective: the mean training loss of the last ``GUARD_BLOCKS`` blocks against the reference. Not below it
        in two checks in a row (a stall, or worse: the loss went up), the committed lossy strategy is left for the
        best lossless one measured (the default unless a lossless candidate beat it), for the rest of the
        training."""
        now = self._mean_loss()
        slow = now is None or not now < self._guard_ref      # NaN (a diverged loss) is not below
        self._guard_slow = self._guard_slow + 1 if slow else 0
        if self._guard_slow < 2:
            return
        figures = self._figures()
        lossless = {h: t for h, t in figures.items() if t[1].is_lossless}
        h, (step_s, best) = min(lossless.items(), key=lambda kv: kv[1][0]) if lossless else \
            (self.default_hash, (None, self.default_strategy))
        left, ref, at = self.committed, self._guard_ref, self.committed_at
        self.stalled.add(left.hash)
        spread = max((w.spread for w in self.windows if w.epoch == self.epoch and w.strategy.hash == h
                      and w.median_s is not None), default=0.0)
        why = (f"the training loss made no progress after the commit to the LOSSY {left.summary()} at step {at}: "
               f"{'no loss' if now is None else format(now, '.4f')} over the last {len(self._recent)} steps against "
               f"{ref:.4f} over as many before it, in two "
               f"checks in a row; back to the best lossless strategy measured")
        self.reverted = {"step": self.steps, "left": left.hash, "left_summary": left.summary(), "committed_at": at,
                         "loss_before": ref, "loss_after": now, "to": best.hash}
        self._commit(best, why, step_s, spread)

    def _outside(self, work) -> None:
        """``work()`` between two steps: what it waited for the other ranks' steps (``waited_s``) is training, the
        rest overhead."""
        t0, waited = time.perf_counter(), self.waited_s
        work()
        wait = self.waited_s - waited
        self.trained_s += wait
        self.overhead_s += time.perf_counter() - t0 - wait

    def _poll(self) -> None:
        """Collective, while rank 0 predicts: whether its answer is in; if so, the window ends at this step."""
        done = self.rank == 0 and self.thread is not None and not self.thread.is_alive()
        if self._all_reduce([1.0 if done else 0.0])[0] > 0:
            self._end_window()

    def _all_reduce(self, values: list[float], op=dist.ReduceOp.MAX) -> torch.Tensor:
        """Collective: the ranks' ``values`` reduced by ``op`` (default their largest); the time this rank waited for
        the last to arrive is added to ``waited_s`` (their steps, not the tuner's overhead)."""
        t0 = time.perf_counter()
        out = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(out, op=op)
        self.waited_s += time.perf_counter() - t0
        return out

    def _optimizer_s(self) -> float:
        """The last optimizer step's time, where the switcher's optimizer measures it (0 elsewhere)."""
        return getattr(getattr(self.model, "_optimizer", None), "last_step_s", 0.0)

    @property
    def half_window(self) -> int:
        """Timed steps of the default's first window and of the windows while rank 0 predicts: half a window, at
        least 4 (a median and a spread)."""
        return max(4, self.window // 2)

    def settle_of(self, strategy: Strategy) -> int:
        return window_steps(strategy, self.window, self.settle)[0]

    def timed_of(self, strategy: Strategy) -> int:
        return window_steps(strategy, self.window, self.settle)[1]

    def _settle(self, w: Window) -> int:
        return self.settle_of(w.strategy) if w.settle is None else w.settle

    def _timed(self, w: Window) -> int:
        return self.timed_of(w.strategy) if w.timed is None else w.timed

    def _going_on(self, source: str) -> Window:
        """The next window of the strategy training now, which goes on without a switch: a synchronous one times
        from its first step (nothing to settle), and while rank 0's prediction runs, half a window (at least 4
        steps), so that the first candidate starts soon after the answer."""
        strategy = self.model.strategy
        going = round_of(strategy) == 1
        # every rank knows whether rank 0 is still predicting (``_polling``, from its broadcast decision): the
        # window's length must be the same on every rank. Nothing to settle: a local mode's rounds go on from the
        # last window's, which ended on an averaging step
        return Window(strategy, source, self.steps, predicted_speedup=self.current.predicted_speedup,
                      epoch=self.epoch, settle=0, timed=self.half_window if going and self._polling else None)

    # --- after the commit: drift (collective) ------------------------------------------------------
    def drift_limit_s(self) -> float:
        """The step time beyond which a watch window counts as drifted: the committed figure times 1 + the larger of
        ``drift`` and twice the committed windows' spread (0 before a commit measured one)."""
        return (1 + max(self.drift, 2 * self.committed_spread)) * (self.committed_s or 0.0)

    def _check_drift(self) -> None:
        now = self._all_reduce([figure(self.committed, self._watch, self._watch_opt)[0]])
        self._watch, self._watch_opt = [], []
        slow = self.committed_s is not None and float(now[0]) > self.drift_limit_s()
        self._drifted = self._drifted + 1 if slow else 0
        if self._drifted < 3 or self.epoch >= self.max_reexplore:
            return
        self._say(f"the step time drifted: {float(now[0]):.4f} s against {self.committed_s:.4f} s when "
                  f"{self.committed.summary()} was committed, in 3 windows in a row; exploring again")
        self._lost_before += self.lost_s()
        measured = {}
        for w in self.windows:
            if w.epoch == self.epoch and w.source == "predicted" and w.outcome == "measured" \
                    and w.strategy.hash not in self.stalled:
                measured.setdefault(w.strategy.hash, (w.strategy, w.predicted_speedup, w.efficiency))
        self.epoch += 1
        self._drifted = 0
        if self.rank == 0:
            self.queue = list(measured.values())
        self.committed = None
        if self.model.strategy.hash != self.default_hash and self._switch(self.default_strategy) is not None:
            self.current = Window(self.model.strategy, "incumbent", self.steps, epoch=self.epoch)
            return
        self.current = Window(self.default_strategy, "default", self.steps, epoch=self.epoch)

    # --- the end of a window (collective) -----------------------------------------------------------
    def _end_window(self) -> None:
        w = self.current
        figures = self._all_reduce(list(figure(w.strategy, w.steps_s, w.optimizer_s)))
        w.median_s, w.spread = float(figures[0]), float(figures[1])
        w.busy = w.busy or self.thread is not None and (self.thread.is_alive() or w.first_step <= self._answered)
        self.windows.append(w)
        if self.observer is not None:          # the first default window: profile and start predicting
            self._start_prediction()
        while True:
            action = [self._decide() if self.rank == 0 else None]
            if self.rank == 0 and action[0][0] == "commit":     # the committed strategy's noise, for the drift check
                h = Strategy.from_dict(action[0][1]["strategy"]).hash
                action[0][1]["spread"] = max((w.spread for w in self.windows if w.epoch == self.epoch
                                              and w.strategy.hash == h and w.median_s is not None), default=0.0)
            dist.broadcast_object_list(action, src=0)
            kind, payload = action[0]
            self._polling = kind == "stay" and payload == "waiting"
            if kind == "stay":
                self.current = self._going_on(self.current.source if self.current.source != "predicted"
                                              else "incumbent")
                if payload == "young":       # only lossy candidates left: this window ends at lossy_after
                    self.current.timed = max(self.half_window, self.lossy_after - self.steps)
                return
            if kind == "incumbent":
                strategy = Strategy.from_dict(payload["strategy"])
                if self._switch(strategy) is None:
                    self.current = Window(strategy, "default" if strategy.hash == self.default_hash else "incumbent",
                                          self.steps, epoch=self.epoch, settle=self._switched_settle())
                    self._say(f"{strategy.summary()} trains until the budget allows the next candidate "
                              f"({payload['lost_s']:.2f} s lost of {payload['trained_s']:.1f} s trained)")
                    return
                self.current = Window(self.model.strategy, "incumbent", self.steps, epoch=self.epoch)
                return
            if kind == "commit":
                self._commit(Strategy.from_dict(payload["strategy"]), payload["why"], payload.get("step_s"),
                             payload.get("spread", 0.0))
                return
            strategy = Strategy.from_dict(payload["strategy"])
            error = self._switch(strategy)
            if error is None:
                self.current = Window(strategy, "predicted", self.steps, predicted_speedup=payload["predicted"],
                                      efficiency=payload["efficiency"], epoch=self.epoch,
                                      settle=self._switched_settle())
                lossy = "" if strategy.is_lossless else \
                    f", LOSSY: efficiency {self._eff_op()} {payload['efficiency']:.2f} predicted"
                self._say(f"trying {strategy.summary()} (predicted {payload['predicted'] or float('nan'):.2f}x{lossy})")
                return
            failed = Window(strategy, "predicted", self.steps, outcome=f"failed: {error}",
                            predicted_speedup=payload["predicted"], epoch=self.epoch)
            self.windows.append(failed)
            self._say(f"{strategy.summary()} failed to start ({error}); staying on {self.model.strategy.summary()}")

    def _switched_settle(self) -> int | None:
        """The untimed steps of a window of the strategy just switched to: none for a local mode that started past
        its warm-up (the switcher's ``resumed``: its steps go on from where the ranks were and its first round
        starts at once, :mod:`autosync.executor.switch`), else the tuner's for the strategy (None)."""
        return 0 if getattr(self.model, "resumed", False) else None

    def _switch(self, strategy: Strategy) -> str | None:
        """The switcher's ``switch``, timed into ``overhead_parts["switch"]``."""
        t0 = time.perf_counter()
        try:
            return self.model.switch(strategy)
        finally:
            self.overhead_parts["switch"] += time.perf_counter() - t0

    def _start_prediction(self) -> None:
        from autosync.profiler.observe import network_here
        from autosync.profiler.profile import Profile

        t0 = time.perf_counter()
        model_profile = self.observer.profile() if self.rank == 0 else None
        self.observer.close()
        self.observer = None
        t1 = time.perf_counter()
        network = network_here(self.rph, device=str(next(self.model.module.parameters()).device))
        self.overhead_parts["profile"] += t1 - t0
        self.overhead_parts["network"] += time.perf_counter() - t1
        if self.rank != 0:
            return
        cluster = self.cluster(network) if callable(self.cluster) else self.cluster
        self.profile = Profile(model_profile, network, cluster, self.env)

        def run():
            try:
                self.proposal["candidates"] = self.propose(self.profile)
            except Exception as e:  # noqa: BLE001 - a prediction that fails leaves the default training
                log.exception("autosync auto: predicting candidates failed")
                self.proposal["error"] = f"{type(e).__name__}: {e}"
            self._answered = self.steps
            self.proposal["took_s"] = time.monotonic() - self._asked

        self._asked = time.monotonic()
        self.thread = threading.Thread(target=run, name="autosync-auto-predict", daemon=True)
        self.thread.start()

    # --- rank 0's decisions -------------------------------------------------------------------------
    def _figures(self) -> dict[str, tuple[float, Strategy]]:
        """Each measured strategy's step time (the median of its windows' medians, leaving out those measured while
        rank 0 predicted where there are others) and the strategy, by hash: the default and the candidates measured
        and not dropped."""
        by: dict[str, list[Window]] = {}
        for w in self.windows:
            if w.epoch == self.epoch and w.median_s is not None and (w.source in ("default", "incumbent")
                                                                     or w.outcome == "measured"):
                by.setdefault(w.strategy.hash, []).append(w)
        out = {}
        for h, ws in by.items():
            ws = [w for w in ws if not w.busy] or ws
            out[h] = (statistics.median(w.effective_s for w in ws), ws[0].strategy)
        return out

    def lost_s(self) -> float:
        """What exploring has cost so far in wall-clock time: each candidate window's steps (timed and settling)
        times how much slower its median step was than the best strategy's (the best by effective step time).
        A lossy window's cost in convergence is not counted: over one window it is small and only predicted.
        Each search (the first, and each after a drift) against its own best."""
        figures = self._figures()
        if not figures:
            return self._lost_before
        best = min(figures.values(), key=lambda t: t[0])[1]
        live = [w for w in self.windows if w.epoch == self.epoch and w.median_s is not None]
        best_ws = [w for w in live if w.strategy.hash == best.hash]
        best_ws = [w for w in best_ws if not w.busy] or best_ws       # as its figure: not while rank 0 predicted
        wall = statistics.median(w.median_s for w in best_ws)
        return self._lost_before + sum((len(w.steps_s) + self._settle(w)) * max(0.0, w.median_s - wall)
                                       for w in live if w.source == "predicted" and not w.sibling)

    def _default(self) -> Window:
        """The default's figure: the median of its windows' medians, leaving out those measured while rank 0
        predicted (when there is one without), and the largest of their spreads."""
        ws = [w for w in self.windows if w.strategy.hash == self.default_hash and w.median_s is not None
              and w.source != "predicted" and w.epoch == self.epoch]
        ws = [w for w in ws if not w.busy] or ws
        merged = Window(ws[0].strategy, "default", ws[0].first_step, [s for w in ws for s in w.steps_s])
        merged.median_s = statistics.median(w.median_s for w in ws)
        merged.spread = max(w.spread for w in ws)
        return merged

    def default_step_s(self) -> float | None:
        """The default's step time the decisions compared with (rank 0)."""
        try:
            return self._default().median_s
        except IndexError:
            return None

    def _decide(self) -> tuple[str, dict | None]:
        last = self.windows[-1]
        default = self._default()
        if last.source == "predicted" and last.median_s is not None and not last.outcome:
            limit = default.median_s * (1 + max(default.spread, last.spread))
            per = "" if last.efficiency == 1 else f" at efficiency {self._eff_op()} {last.efficiency:.2f}"
            if last.effective_s > limit:
                last.outcome = (f"dropped: slower than the default{per} "
                                f"({last.effective_s / default.median_s:.2f}x its step)")
            else:
                last.outcome = "measured"
            self._say(f"window {len(self.windows)}: {last.strategy.summary()}: {last.median_s:.4f} s/step{per} "
                      f"(default {default.median_s:.4f}, {default.median_s / last.effective_s:.2f}x): {last.outcome}")
        elif last.source == "default":
            last.outcome = "measured"
        if self.queue is None:
            if "error" in self.proposal:
                return "commit", {"strategy": default.strategy.canonical(), "step_s": default.median_s,
                                  "why": f"no candidates: {self.proposal['error']}"}
            if "candidates" not in self.proposal:
                if time.monotonic() - self._asked > self.max_wait_s:
                    return "commit", {"strategy": default.strategy.canonical(), "step_s": default.median_s,
                                      "why": "the prediction took too long"}
                return "stay", "waiting"
            self.queue, seen = [], {self.default_hash}
            for s, p, *eff in self.proposal["candidates"]:
                s = self.model.adapt(s)         # as the switcher would train it (a framework's DDP keeps its buckets;
                if s is None:                   # None: it cannot)
                    continue
                e = 1.0 if s.is_lossless else (eff[0] if eff and eff[0] and eff[0] > 0 else None)
                if s.hash not in seen and e is not None:
                    seen.add(s.hash)
                    self.queue.append((s, p, e))
            self.queue = self.queue[:self.max_candidates]
            self._say(f"{len(self.queue)} candidates to try (predicted in {self.proposal['took_s']:.1f} s): "
                      + "; ".join(s.summary() for s, *_ in self.queue))
        while self.queue and self._sibling_measured():     # each call takes one sibling off the queue
            continue
        figures = self._figures()
        best_s, best = min(figures.values(), key=lambda t: t[0])
        if self.queue:
            lost = self.lost_s()
            ready = self._ready()
            if lost <= self.budget * self.trained_s and ready is not None:
                strategy, predicted, efficiency = self.queue.pop(ready)
                return "try", {"strategy": strategy.canonical(), "predicted": predicted, "efficiency": efficiency}
            if best.hash != self.model.strategy.hash:
                return "incumbent", {"strategy": best.canonical(), "lost_s": lost, "trained_s": self.trained_s}
            # only lossy candidates left and the training still young: the strategy training now goes on until then
            return "stay", None if ready is not None else "young"
        if best.hash == self.default_hash or best_s >= default.median_s:
            return "commit", {"strategy": default.strategy.canonical(), "why": "nothing beat the default",
                              "step_s": default.median_s}
        what = "steps/s" if best.is_lossless else f"goodput at {self.efficiency_words()} (LOSSY)"
        wall = statistics.median(w.median_s for w in self.windows if w.epoch == self.epoch
                                 and w.strategy.hash == best.hash and w.median_s is not None)
        return "commit", {"strategy": best.canonical(), "step_s": wall,
                          "why": f"{default.median_s / best_s:.2f}x the default's {what}"}

    def _ready(self) -> int | None:
        """Rank 0: the queue's index of the next candidate to try: the first, unless the training is younger than
        ``lossy_after`` steps, when lossy candidates wait and the first lossless one goes (None: none may go yet)."""
        if self.steps >= self.lossy_after:
            return 0
        return next((i for i, (s, *_) in enumerate(self.queue) if s.is_lossless), None)

    def _eff_op(self) -> str:
        return "~" if self.efficiency_rule == "point" else ">="

    def efficiency_words(self) -> str:
        """What a lossy candidate's efficiency is, in words."""
        return "its predicted efficiency's " + ("point estimate" if self.efficiency_rule == "point" else "lower bound")

    def _sibling_measured(self) -> bool:
        """Rank 0: when the next candidate sends what a strategy measured in this search sends in the steps a
        window times (the same :meth:`~autosync.strategy.Strategy.steady_traffic_hash`: DiLoCo variants that
        differ in their outer learning rate or momentum, and with one rank per host, local modes that differ only
        in the plans and buckets of their warm-up), it takes that one's step time instead of a window of its own,
        judged at its own efficiency; True when it did (and left the queue)."""
        strategy, predicted, efficiency = self.queue[0]
        key = strategy.steady_traffic_hash(self.rph)
        measured = [w for w in self.windows if w.epoch == self.epoch and w.median_s is not None and not w.sibling
                    and w.steps_s and w.strategy.steady_traffic_hash(self.rph) == key
                    and not w.outcome.startswith("failed")]
        if not measured:
            return False
        self.queue.pop(0)
        source = measured[-1]
        w = Window(strategy, "predicted", self.steps, median_s=source.median_s, spread=source.spread,
                   predicted_speedup=predicted, efficiency=efficiency, epoch=self.epoch, sibling=source.strategy.hash)
        default = self._default()
        limit = default.median_s * (1 + max(default.spread, w.spread))
        w.outcome = "dropped: slower than the default" if w.effective_s > limit else "measured"
        self.windows.append(w)
        self._say(f"{strategy.summary()}: not trained, the same traffic as {source.strategy.summary()} "
                  f"({w.median_s:.4f} s/step), at efficiency {self._eff_op()} {efficiency:.2f}: {w.outcome}")
        return True

    def _commit(self, strategy: Strategy, why: str, step_s: float | None = None, spread: float = 0.0) -> None:
        if strategy.hash != self.model.strategy.hash:
            error = self._switch(strategy)
            if error is not None:      # it built before; if it does not now, the current one stays
                why, strategy, step_s = f"{strategy.summary()} failed to start again ({error})", \
                    self.model.strategy, None
            else:
                settle = self._switched_settle()
                self._watch_from = self.steps + (self.settle_of(strategy) if settle is None else settle)
        self.committed, self.committed_s, self._watch, self._watch_opt, self._drifted = strategy, step_s, [], [], 0
        self.committed_at, self.committed_spread, self.committed_why = self.steps, spread, why
        self._arm_guard()
        if self.rank == 0:
            self._say(f"committed to {strategy.summary()} at step {self.steps}: {why}; exploration took "
                      f"{self.exploration_steps()} of {self.steps} steps "
                      f"({self.lost_s():.2f} s lost against the best), "
                      f"{self.overhead_s:.1f} s outside them")
            if self.on_commit is not None:
                self.on_commit(strategy, self)

    def finish(self) -> None:
        """The training ended: if the search had not committed yet, rank 0 commits what it measured so far (the
        fastest measured strategy by effective step time, the default unless something beat it) through
        ``on_commit`` (the strategy file), without switching: nothing trains any more. Not collective; a no-op on
        the other ranks, after a commit, or before the first window ended (nothing measured: no file)."""
        if self.committed is not None or self.rank != 0:
            return
        figures = self._figures()
        if not figures:
            self._say(f"the training ended at step {self.steps}, before the first window: nothing to commit")
            return
        best_s, best = min(figures.values(), key=lambda t: t[0])
        default = figures.get(self.default_hash)
        if default is not None and best_s >= default[0]:
            best_s, best = default
        vs = f", {default[0] / best_s:.2f}x the default's step" if default is not None and best is not default[1] \
            else ""
        why = f"the training ended during the search: the fastest measured so far{vs}"
        self.committed, self.committed_s, self.committed_at, self.committed_why = best, best_s, self.steps, why
        self._say(f"committed to {best.summary()} at step {self.steps}: {why}; exploration took "
                  f"{self.exploration_steps()} of {self.steps} steps ({self.lost_s():.2f} s lost against the best)")
        if self.on_commit is not None:
            self.on_commit(best, self)

    def exploration_steps(self) -> int:
        """Steps trained by candidates that were not committed to (what exploring cost)."""
        chosen = self.committed.hash if self.committed is not None else None
        return sum(len(w.steps_s) + self._settle(w) for w in self.windows
                   if w.source == "predicted" and w.strategy.hash != chosen and w.steps_s)

    def _say(self, text: str) -> None:
        if self.rank == 0:
            log.info("autosync auto: %s", text)
            if self.report is not None:
                self.report(f"autosync auto: {text}")


def tune_result(tuner: OnlineTuner):
    """What ``tuner`` measured, as a :class:`~autosync.search.result.TuneResult` (the report's input): one
    measured strategy per strategy of the last search (samples/s from the slowest rank's median step over its
    windows; a failed or dropped candidate with its reason), a lossy one at its efficiency's predicted lower
    bound."""
    from autosync.search.result import Measured, TuneResult

    m = tuner.profile.model if tuner.profile is not None else None
    samples = (m.batch_size * tuner.profile.cluster.world_size) if m is not None else 1
    by: dict[str, list[Window]] = {}
    for w in tuner.windows:
        if w.epoch == tuner.epoch:
            by.setdefault(w.strategy.hash, []).append(w)
    measured = []
    for ws in by.values():
        first = ws[0]
        timed = [w for w in ws if w.median_s is not None and not w.outcome.startswith(("failed", "dropped"))]
        timed = [w for w in timed if not w.busy] or timed
        bad = next((w.outcome for w in ws if w.outcome.startswith(("failed", "dropped"))), "") or \
            next((f"not trained: the step time of {w.sibling}, the same traffic" for w in ws if w.sibling), "")
        source = "ddp_default" if first.strategy.hash == tuner.default_hash else "predicted"
        lossy = not first.strategy.is_lossless
        step = statistics.median(w.median_s for w in timed) if timed else \
            next((w.median_s for w in ws if w.median_s is not None), None)
        measured.append(Measured(
            source, first.strategy, first.predicted_speedup or float("nan"),
            "failed" if bad.startswith("failed") else "ok" if timed else "dropped", samples / step if step else 0.0,
            bad.split(": ", 1)[-1] if bad else "", efficiency=first.efficiency, efficiency_lo=first.efficiency,
            efficiency_hi=first.efficiency, efficiency_source="predicted" if lossy else "lossless"))
    default = next((x for x in measured if x.source == "ddp_default" and x.status == "ok"), None)
    chosen = tuner.committed or tuner.model.strategy
    pick = next((x for x in measured if x.strategy.hash == chosen.hash), None)
    return TuneResult(chosen, pick.source if pick else "ddp_default",
                      pick.predicted_speedup if pick else float("nan"), measured,
                      default.samples_per_s if default else None, objective="time-to-loss",
                      note="measured during training: each figure is the slowest rank's median step over windows of "
                           f"the training's own steps; a lossy strategy's efficiency is {tuner.efficiency_words()}")


def predict_candidates(profile, model, base, card, config, k: int = 4, adapt=None,
                       efficiency_model=None) -> list[tuple[Strategy, float, float]]:
    """The cost model's best ``k`` diverse strategies that can be switched to live, each sending in its steady steps
    what no better ranked one sends (:meth:`~autosync.strategy.Strategy.steady_traffic_hash`), and predicted faster
    than the DDP default (by goodput for time to loss; any, with a ranker), as (strategy, predicted speedup
    over the DDP default, efficiency): the prediction of ``tune --measure 0`` on ``profile``, hand-crafted baselines
    scored beside Optuna's candidates. With ``config.lossless`` only lossless ones (efficiency 1); otherwise lossy
    ones too, with ``efficiency_model`` (time-to-loss) ranked by their predicted goodput at the lower bound of
    their efficiency's interval (``config.zero_shot == "lower"``) or at its point estimate (``"point"``), the
    efficiency returned (how the tuner judges them); without it (throughput) by speed alone (efficiency 1); the
    speedup returned is that goodput. ``adapt``: how the switcher trains a
    strategy (a framework's DDP keeps its bucket options; None where it cannot: a local mode on a framework's DDP);
    the candidates are adapted, then scored again."""
    from autosync.search.baselines import baselines
    from autosync.search.proposer import Proposer, pick_diverse, predicted_speedup

    eff_model = efficiency_model if config.objective == "time-to-loss" and not config.lossless else None
    proposer = Proposer(profile, model, base, None, None, config, eff_model, float("nan"), card)
    proposer.propose(config.candidates)
    hand = [s for s in baselines(profile).values() if s.is_lossless or not config.lossless]
    for s, score in zip(hand, proposer.score(hand)):
        proposer.scored.setdefault(s.hash, (float(score), s))
    ranked = [(sc, s) for sc, s in proposer.ranked()
              if (s.is_lossless or not config.lossless) and switchable(s, local=True) is None]
    exclude = {Strategy.default().hash}
    if adapt is not None:
        unique: dict[str, Strategy] = {}
        for _, s in ranked:
            a = adapt(s)
            if a is not None:
                unique.setdefault(a.hash, a)
        ranked = sorted(zip(proposer.score(list(unique.values())), unique.values()), key=lambda t: -t[0])
        exclude.add(adapt(Strategy.default()).hash)
    lower = {s.hash: 1.0 for _, s in ranked}
    lossy = [s for _, s in ranked if not s.is_lossless]
    if eff_model is not None and lossy:   # as the tuner judges them: goodput at the efficiency it is given
        eff, lo, _ = eff_model.bounds(profile, lossy, float("nan"))
        shift = {}
        for s, e, b in zip(lossy, eff, lo):
            judged = float(b) if config.zero_shot == "lower" else float(e)
            lower[s.hash] = judged
            shift[s.hash] = math.log(max(judged, 0.05) / max(float(e), 0.05))
        ranked = sorted(((sc + shift.get(s.hash, 0.0), s) for sc, s in ranked), key=lambda t: -t[0])
    if model.kind == "regressor":        # the default predicts 1x: a candidate predicted slower is not worth a window
        ranked = [(sc, s) for sc, s in ranked if predicted_speedup(proposer.model, sc) > 1.0]
    # a window tells only what a strategy's timed steps send: of the strategies that send the same (local modes
    # that differ in their warm-up's plans with one rank per host, DiLoCo's outer learning rates), the best ranked
    # stands for all, so that the k candidates are k different measurements
    rph, seen, distinct = profile.cluster.ranks_per_node, set(), []
    for sc, s in ranked:
        key = s.steady_traffic_hash(rph)
        if key not in seen:
            seen.add(key)
            distinct.append((float(sc), s))
    picks = pick_diverse(distinct, k, exclude, config.min_distance)
    return [(s, predicted_speedup(proposer.model, sc), lower[s.hash]) for sc, s in picks]
