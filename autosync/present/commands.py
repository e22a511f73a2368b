"""What the ``autosync`` command says: each command's help, description, example and options.

:mod:`autosync.cli` builds its parser from :data:`COMMANDS` and binds each name to a handler. An option is a
:data:`SHARED` name (``"seed"``, or ``("seed", "its own help"[, more argparse keywords])``), or ``(flags, type,
default, help[, more argparse keywords])`` with type one of the CLI's kinds (``positive_int``, ``nonneg_int``,
``positive_float``, ``cluster``, ``storage``, ``path``, ``dir``, ``str``), ``"flag"``, or a tuple of choices.
``autosync tune``'s options come from :class:`~autosync.search.config.TuneConfig`'s fields (:func:`tune_options`).
"""
from __future__ import annotations

import argparse

from autosync.datasets import SHIPPED

UNSHAPED = ("measure on this host's loopback without shaping the links (no root needed); the results are labelled "
            "unshaped and never mixed with shaped data")
BEYOND = ("measure even a cluster beyond what this machine emulates faithfully (more than 2 ranks per core, or links "
          "faster than it carries); results are labelled emulated-beyond")
IN_JOB = ("run inside the distributed job this command was started in (torchrun --nnodes N --nproc-per-node G -m "
          "autosync.cli ... --in-job): measure on the job's own ranks, devices and network instead of an emulated "
          "cluster; rank 0 writes every file, the other ranks serve it; --cluster gives the job's shape (hosts x "
          "ranks; tune: default the job's own, its links measured). ")
#: options several commands share, by name: (flags, type, default, help); a command may give its own help
SHARED = {
    "workload": (("--workload", "--model"), "str", None, "built-in workload (list: autosync workloads) or "
                 "'pkg.module:function' / 'path/file.py:function'", {"dest": "workload", "required": True,
                                                                       "metavar": "W"}),
    "cluster": (("--cluster",), "cluster", None, "cluster spec, e.g. 2x1@1gbit", {"required": True}),
    "batch-size": (("--batch-size",), "positive_int", None, "per-rank batch size (default: the workload's)"),
    "seed": (("--seed",), "nonneg_int", 0, "seed (default 0)"),
    "data": (("--data",), "dir", "autosync-data", "dataset directory (default ./autosync-data)"),
    "unshaped": (("--unshaped",), "flag", False, UNSHAPED),
    "beyond-range": (("--beyond-range",), "flag", False, BEYOND),
    "json": (("--json",), "flag", False, "print the measurements as JSON"),
    "backend": (("--backend",), ("nccl", "gloo"), None, "with --in-job: the process group's backend (default: nccl "
                "on GPUs, gloo on CPUs)"),
}


def tune_options() -> list:
    """``autosync tune``'s options: the TuneConfig's fields (their defaults and help are written there), and the
    command's own."""
    from dataclasses import fields

    from autosync.search.config import TuneConfig

    out = []
    for f in fields(TuneConfig):
        if f.metadata:   # the objective defaults to None here, so that --lossless can tell it was not given
            out.append((f.metadata["flag"], f.metadata["kind"], None if f.name == "objective" else f.default,
                        f.metadata["help"], {"dest": f.name}))
    return out + [("--lossless", "flag", False, "the same as --objective lossless"),
                  ("--out", "path", "strategy.yaml", "recommended strategy (default strategy.yaml)"),
                  ("--plot", "str", None, "predicted vs measured plot (default: next to --out)", {"metavar": "PNG"}),
                  ("--report", "str", None, "self-contained report of the tune: context, pick, every measured strategy, "
                   "plots (default: next to --out, e.g. strategy.html)", {"metavar": "HTML"}),
                  ("--in-job", "flag", False, IN_JOB + "A trial that fails ends the job so that torchrun "
                   "--max-restarts starts it again with a fresh process group; the search resumes from the dataset "
                   "and the study, the failed trial stored with its reason. --timeout is then also the limit of each "
                   "collective."), "backend"]


#: name -> (help, description, example, options); the order of ``autosync --help``
COMMANDS = {
    "run": ("measure one strategy on real ranks",
        "Train a workload for a few steps with a strategy (default: PyTorch DDP's default) on N local gloo ranks, "
        "and report throughput, median step time, its coefficient of variation and peak memory. Under torchrun it "
        "runs on the job's ranks instead of spawning its own.",
        "example: autosync run --workload bert-mini --nproc 2 --strategy strategy.yaml\n"
        "         autosync run --workload resnet-tiny --cluster 2x1@100mbit --strategy auto --steps 200",
        ("workload", None), ("--strategy", "path", None, "strategy YAML or JSON (default: the DDP default); auto: "
         "tune while training --steps steps (windows of the training's own steps; prints each window and the "
         "commit)"),
        ("--out", "path", None, "with --strategy auto: write the committed strategy here"),
        ("--explore-budget", "positive_float", 0.05, "with --strategy auto: the share of the training time "
         "candidates may lose against the best strategy so far (default 0.05; 1 tries every candidate at once)"),
        ("--objective", ("time-to-loss", "throughput", "lossless"), "time-to-loss", "with --strategy auto: what "
         "the commit maximizes: time-to-loss (default: lossy candidates at their predicted efficiency), throughput "
         "(samples/s, lossy or not) or lossless (lossy candidates left out)"),
        ("--lossy-after", "nonneg_int", 0, "with --strategy auto: the first step at which a lossy candidate may "
         "train a window (default 0)"),
        ("--no-guard", "flag", False, "with --strategy auto: turn the loss guard off (by default a lossy commit "
         "whose training loss makes no progress goes back to the best lossless strategy measured)"),
        ("--nproc", "positive_int", None, "number of local ranks (default 2)"),
        ("cluster", "run on an emulated cluster, e.g. 2x1@100mbit (world size from the spec; needs root)",
         {"required": False}),
        ("--ranks-per-host", "positive_int", None, "ranks that share a host, for hierarchical plans and local SGD "
         "(default: all)"), "batch-size", ("--steps", "positive_int", 10, "timed steps (default 10)"),
        ("--warmup", "nonneg_int", 3, "untimed warm-up steps (default 3)"), ("seed", "model and data seed (default 0)"),
        ("--timeout", "positive_float", 300.0, "time limit in seconds of the trial, and of its ranks' start (which has "
         "at most 120 s); all ranks are killed when it runs out (default 300)"),
        ("json", "print the TrialResult as JSON instead of a table"), "unshaped"),
    "workloads": ("list the built-in workloads",
        "List the built-in workloads: name, default batch size per rank and what each trains (architectures built "
        "from configs, learnable synthetic tasks). Any command's --workload also takes 'pkg.module:function' or "
        "'path/file.py:function' returning (model, make_batch).", "example: autosync workloads"),
    "cluster check": ("bring a cluster up, measure every host link and host speed, tear it down",
        "Bring SPEC up, measure each host link with torch.distributed point-to-point transfers and a ping-pong, "
        "print configured vs measured bandwidth and latency; then measure each host's compute speed (matrix "
        "products on all ranks at once, with the CPU limits lifted and applied).",
        "example: autosync cluster check '2x1@1gbit;node1=100mbit;node1=cpu:0.5'",
        ("spec", "cluster", None, "NODESxRANKS@BANDWIDTH[,LATENCY][;nodeK=...]", {"metavar": "SPEC"}),
        ("--seconds", "positive_float", 0.5, "length of each transfer (default 0.5 s)"),
        ("--compute-seconds", "positive_float", 2.0, "length of each compute measurement (default 2 s; give "
         "stragglers several slices)"), "json"),
    "cluster sweep": ("remove namespaces left by dead autosync runs",
        "Delete the network namespaces (and their veths) of autosync runs whose process is gone. --all deletes "
        "those of live runs too.", None,
        ("--all", "flag", False, "also remove the namespaces of running autosync processes")),
    "profile": ("profile a workload and a cluster into profile.json",
        "Profile a workload (per-parameter sizes, bucket layout, forward/backward/optimizer times, gradient-ready "
        "times, FLOPs, peak memory) and a cluster (collective micro-benchmarks fitted to alpha + bytes*beta) on an "
        "emulated cluster, or with --nominal from the spec's numbers alone.",
        "example: autosync profile --workload bert-mini --cluster 2x1@1gbit --out profile.json",
        ("workload", "workload, as for run"), "cluster", "batch-size",
        ("--nominal", "flag", False, "do not measure the network: take the spec's bandwidth and latency (a cluster "
         "you lack)"), ("--out", "path", "profile.json", "where to write the profile (default profile.json)"),
        ("--timeout", "positive_float", 900.0, "time limit in seconds (default 900)"), "unshaped",
        ("--in-job", "flag", False, IN_JOB + "--timeout is then also the limit of each collective."), "backend"),
    "collect": ("measure baselines and random strategies into a dataset",
        "Build the runtime dataset: for every (workload, cluster) context, profile once, then measure every "
        "hand-crafted baseline and N random strategies on the emulated cluster, keeping the rank processes alive "
        "across trials. Each result is appended at once; run the same command again after an interruption and it "
        "skips what is stored.",
        "example: autosync collect --workloads mlp ncf --clusters 2x1@100mbit 2x2@1gbit --per-context 20",
        ("--workloads", "str", None, "workloads, as for run", {"nargs": "+", "required": True, "metavar": "W"}),
        ("--clusters", "cluster", None, "cluster specs", {"nargs": "+", "required": True}),
        ("--per-context", "nonneg_int", 20, "random strategies per context, besides the baselines (default 20)"),
        ("--modes", "str", None, "only these sync modes (e.g. diloco): the DDP default, their baselines and "
         "--per-context draws of them; adds a new mode's trials to an existing dataset's contexts (default: the "
         "whole space)", {"nargs": "+", "metavar": "MODE"}),
        "data", "batch-size", ("--timeout", "positive_float", 90.0, "time limit of each trial (default 90 s)"),
        ("--budget", "positive_float", 4.0, "about how long the timed steps of one trial may take (default 4 s; at "
         "least 3 steps)"), ("seed", "seed of the random draws (default 0)"), "unshaped", "beyond-range",
        ("--in-job", "flag", False, IN_JOB + "Give one --clusters spec; --timeout is then also the limit of each "
         "collective."), "backend"),
    "efficiency": ("measure what lossy strategies cost in convergence (statistical efficiency)",
        "For the lossy strategies a dataset's trials hold, train each against the lossless DDP default (paired: "
        "same initial weights, data order and learning rate) on loopback ranks, and store its statistical "
        "efficiency (samples the default needs to reach a target evaluation loss / samples it needs) in the "
        "dataset's efficiency table. The math does not depend on the network, so one measurement serves every "
        "cluster with the same world size. Resumes: stored keys are skipped.",
        "example: autosync efficiency --data autosync-data --workloads mlp --per-group 10",
        "data", ("--workloads", "str", None, "only these workloads (default: all)", {"nargs": "+", "metavar": "W"}),
        ("--worlds", "positive_int", None, "only these world sizes (default: all)", {"nargs": "+", "metavar": "N"}),
        ("--per-group", "positive_int", 10, "lossy keys per (workload, batch, world) group (default 10)"),
        ("--modes", "str", None, "only the strategies of these sync modes (e.g. diloco; default: every lossy one)",
         {"nargs": "+", "metavar": "MODE"}),
        ("seed", "seed of the order of the keys (default 0)"),
        ("--timeout", "positive_float", 1800.0, "time limit of one training run (s)"),
        ("--again", "flag", False, "instead, measure again every stored row an older protocol measured differently "
         "(censored at the horizon, or a band wider than 15%% that protocol 4 narrows with more seed pairs: such a "
         "row is not reused), or a row of a mode that drifts (local SGD, DiLoCo, adaptive, selective) with fewer "
         "than 2 seed pairs (extended: its seed-0 curve stands), with its own strategy; --workloads, --worlds and "
         "--modes still select, --per-group and --seed do not apply")),
    "merge": ("add the trials of other datasets to one",
        "Add every trial, efficiency measurement and profile of the SOURCE datasets to --data (created if missing). "
        "A row whose (context, strategy) is stored there already is kept as it is, so merging the same source twice "
        "adds nothing. Use it to pool datasets collected on several machines, or your own with the shipped one, "
        "before `autosync train`.", "example: autosync merge shipped my-cluster-data --data pooled",
        ("sources", "str", None, "dataset directories to read ('shipped': the dataset shipped with autosync)",
         {"nargs": "+", "metavar": "SOURCE"}),
        ("--data", "str", None, "the dataset to add them to (created if missing)", {"required": True, "metavar": "DIR"})),
    "train": ("train the LightGBM cost model on a dataset",
        "Fit the cost model (LightGBM ranker or regressor on the speedup over the DDP default) to a dataset and save "
        "it as LightGBM text plus a JSON card. With --evaluate, the card carries its leave-one-workload/cluster-out "
        "metrics.", None,
        ("--data", "str", SHIPPED, "dataset directory (default: the dataset shipped with autosync)"),
        ("--out", "str", "autosync-model", "output directory (default ./autosync-model)", {"metavar": "DIR"}),
        ("--kind", ("ranker", "regressor"), "ranker", "model kind (default ranker)"),
        ("--evaluate", "flag", False, "also run the held-out evaluation and store it in the card"), "seed"),
    "evaluate": ("held-out transfer evaluation of the cost model",
        "Leave-one-workload-out and leave-one-cluster-out evaluation: pairwise ranking accuracy, Kendall tau, top-1 "
        "regret and top-5 hit, for the LightGBM ranker, the regressor, the simulator alone and the ranker without "
        "simulator features.", None,
        ("--data", "str", SHIPPED, "dataset directory (default: shipped)"),
        ("--split", ("workload", "cluster", "both"), "both", "which groups to hold out (default both)"),
        ("--plot", "str", "transfer.png", "where to write the plot (default transfer.png)", {"metavar": "PNG"}),
        ("--markdown", "path", None, "also write the summary table as Markdown"), "seed"),
    "tune": ("find the best synchronization strategy (the main job)",
        "Profile the workload and the cluster, let Optuna propose strategies scored by the LightGBM cost model, "
        "measure the most promising ones for real on the emulated cluster (plus the DDP default and the "
        "best-predicted hand-crafted baseline), and write the fastest measured strategy. It never recommends "
        "something slower than the measured DDP default.",
        "example: autosync tune --workload bert-mini --cluster 2x1@100mbit --measure 8 --out strategy.yaml",
        ("cluster", "cluster spec, e.g. 2x1@1gbit; with --in-job it may be left out: the job's own hosts x ranks, "
         "its links measured (rates labelled on a ladder: 100mbit, 200mbit, ..., 1gbit, ...)", {"required": False}),
        tune_options),
    "bench": ("run one of the benchmarks of a source checkout (bench/*.py)",
        "Run a benchmark script from the source checkout's bench/ folder; it prints its table and writes it to "
        "bench/results/. Arguments after the name go to the script (try NAME --help).",
        "example: autosync bench hook_overhead   |   autosync bench --list",
        ("name", "str", None, "benchmark name (a bench/NAME.py)", {"nargs": "?", "metavar": "NAME"}),
        ("args", "str", None, "arguments for the benchmark", {"nargs": argparse.REMAINDER}),
        ("--list", "flag", False, "list the benchmarks and what they measure")),
}
