"""In-job vs emulated: the same workload and cluster tuned two ways, and their picks compared side by side.

- **emulated**: ``autosync tune --cluster C`` (the emulator's rank pool on the namespaces);
- **in-job**: one ``torchrun`` per emulated host (``EmulatedCluster.torchrun``), ``autosync tune --in-job``
  (the job's own ranks; rank 0 drives), over the same shaped links.

Each arm starts from an empty dataset and study (it profiles for itself), with the same seed, measure
budget and objective. Then both picks and the DDP default are re-measured on the emulated cluster,
``--repeats`` rounds interleaved, and compared by medians: the arms *agree* when they picked the same
strategy, or when the in-job pick is as fast as the emulated one within the larger of the two picks'
spreads (half the max-min range of their repeats). Run alone on the machine.

    python bench/in_job_vs_emulated.py                                   # mlp, resnet-tiny x 2x1@100mbit
    python bench/in_job_vs_emulated.py --workloads mlp --clusters 2x1@1gbit --measure 4
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402


def tune_args(workload: str, cluster: str, work: Path, arm: str, args) -> list[str]:
    return ["tune", "--workload", workload, "--cluster", cluster, "--measure", str(args.measure), "--objective",
            "throughput", "--confirm-rounds", str(args.confirm_rounds), "--seed", str(args.seed),
            "--storage", f"sqlite:///{work}/{arm}.db", "--data", str(work / f"data-{arm}"),
            "--out", str(work / f"{arm}.yaml"), "--timeout", "90"]


def run_emulated(workload: str, cluster: str, work: Path, args) -> float:
    t0 = time.monotonic()
    with open(work / "emulated.log", "w") as log:
        subprocess.run([sys.executable, "-m", "autosync.cli", *tune_args(workload, cluster, work, "emulated", args)],
                       cwd=work, check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.monotonic() - t0


def run_in_job(workload: str, cluster: str, work: Path, args) -> float:
    from autosync.cluster import parse_cluster
    from autosync.executor.emulate import EmulatedCluster

    c = parse_cluster(cluster)
    argv = ["-m", "autosync.cli", *tune_args(workload, cluster, work, "in-job", args), "--in-job"]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    t0 = time.monotonic()
    with EmulatedCluster(c) as emu:
        procs = [subprocess.Popen(emu.torchrun(h, argv, run_id="bench"), cwd=work, env=env,
                                  stdout=open(work / f"in-job-{h}.log", "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True) for h in range(c.nodes)]
        try:
            codes = [p.wait(timeout=3600) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    if codes != [0] * c.nodes:
        raise SystemExit(f"in-job tune failed ({codes}); see {work}/in-job-*.log")
    return time.monotonic() - t0


def remeasure(workload: str, cluster: str, strategies: dict, repeats: int) -> dict[str, list[float]]:
    """samples/s of each strategy, ``repeats`` interleaved rounds, on the emulated cluster."""
    from autosync import workloads as W
    from autosync.cluster import parse_cluster
    from autosync.executor.emulate import emulate
    from autosync.executor.measure import TrialSpec, measure

    c = parse_cluster(cluster)
    out: dict[str, list[float]] = {k: [] for k in strategies}
    with emulate(c) as emu, emu.pool() as pool:
        for _ in range(repeats):
            for name, s in strategies.items():
                spec = TrialSpec(workload, s.canonical(), W.default_batch_size(workload), 2, 8, time_budget_s=4.0)
                r, _ = measure(pool, spec, timeout=120)
                out[name].append(r.samples_per_s if r.ok else 0.0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["mlp", "resnet-tiny"])
    ap.add_argument("--clusters", nargs="+", default=["2x1@100mbit"])
    ap.add_argument("--measure", type=int, default=4)
    ap.add_argument("--confirm-rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(_results.RESULTS / "in_job_vs_emulated.md"))
    args = ap.parse_args()

    from autosync.strategy import Strategy, load_strategy

    rows = []
    for cluster in args.clusters:
        for workload in args.workloads:
            work = Path(tempfile.mkdtemp(prefix="autosync-injob-bench-"))
            try:
                print(f"{workload} on {cluster}: tuning through the emulator", flush=True)
                t_emu = run_emulated(workload, cluster, work, args)
                print(f"{workload} on {cluster}: tuning in a torchrun job over the emulated hosts", flush=True)
                t_job = run_in_job(workload, cluster, work, args)
                picks = {"emulated": load_strategy(work / "emulated.yaml"), "in-job": load_strategy(work / "in-job.yaml")}
                strategies = {"default": Strategy.default(), **picks}
                speeds = remeasure(workload, cluster, strategies, args.repeats)
                trace = {arm: [ln.strip() for ln in (work / log).read_text().splitlines() if ln.startswith("  measured ")]
                         for arm, log in (("emulated", "emulated.log"), ("in-job", "in-job-0.log"))}
            finally:
                shutil.rmtree(work, ignore_errors=True)
            med = {k: statistics.median(v) for k, v in speeds.items()}
            spread = {k: (max(v) - min(v)) / 2 / max(statistics.median(v), 1e-9) for k, v in speeds.items()}
            same = picks["emulated"].hash == picks["in-job"].hash
            ratio = med["in-job"] / max(med["emulated"], 1e-9)
            noise = max(spread["emulated"], spread["in-job"])
            agree = same or ratio >= 1 - noise
            rows.append((workload, cluster, picks, med, spread, ratio, noise, agree, t_emu, t_job, trace))
            print(f"  picks {picks['emulated'].hash[:8]} / {picks['in-job'].hash[:8]}; in-job/emulated {ratio:.2f} "
                  f"(noise {noise:.0%}); agree: {agree}", flush=True)
    lines = ["# In-job vs emulated tuning", "",
             "The same workload and cluster tuned through the emulator and inside a torchrun job over the same "
             "emulated hosts (one torchrun per host namespace); both picks and the DDP default re-measured on the "
             f"emulated cluster, {args.repeats} rounds interleaved; samples/s are medians, +- half the range. "
             f"Each tune: --measure {args.measure} --objective throughput --confirm-rounds {args.confirm_rounds}, "
             "empty dataset and study.", "",
             "| workload | cluster | emulated pick | in-job pick | default samples/s | emulated pick samples/s | "
             "in-job pick samples/s | in-job / emulated | agree | tune wall s (emulated / in-job) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for wl, cl, picks, med, spread, ratio, noise, agree, t_emu, t_job, _ in rows:
        lines.append(f"| {wl} | {cl} | {picks['emulated'].hash[:8]} | {picks['in-job'].hash[:8]} | "
                     f"{med['default']:,.1f} | {med['emulated']:,.1f} +-{spread['emulated']:.0%} | "
                     f"{med['in-job']:,.1f} +-{spread['in-job']:.0%} | {ratio:.2f} | "
                     f"{'same pick' if picks['emulated'].hash == picks['in-job'].hash else ('yes' if agree else 'NO')} | "
                     f"{t_emu:.0f} / {t_job:.0f} |")
    n_agree = sum(r[7] for r in rows)
    lines += ["", f"Agree in {n_agree} of {len(rows)} contexts (same pick, or in-job pick within the picks' noise).",
              "", "What each arm measured while tuning (its own measurements, before the re-measurement above):"]
    for wl, cl, *_, trace in rows:
        for arm, measured in trace.items():
            lines += ["", f"{wl} on {cl}, {arm}:", "", "```", *measured, "```"]
    print(f"-> {_results.write(args.out, lines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
