"""GPU check: every plan, compressor and sync mode on CUDA tensors, the lossless ones against plain DDP,
and the profiler on CUDA; one table, written to bench/results/gpu_check.md.

Two set-ups, each a pool of local ranks (:class:`autosync.executor.launch.RankPool`):

- **nccl**: one rank per GPU (world 1 on a one-GPU machine: every collective still goes through NCCL
  and every hook path runs, but there is no peer to disagree with);
- **gloo+cuda**: 2 ranks sharing the GPUs, CUDA tensors over gloo (which reduces and broadcasts CUDA
  tensors through host memory), so the plans' collectives meet a real peer.

A strategy passes when its trial ends ``ok`` with a finite loss and, when lossless, its final parameters
equal those of plain DDP (torch's own all-reduce, no autosync hook) to rounding (rtol 1e-4 on CUDA:
reduction order differs). A collective a backend does not offer fails its row with the backend's own
error: that is a finding, not a crash. On a machine without CUDA the script says so and exits 2.

    python bench/gpu_check.py                 # gpt2-tiny (embeddings: row_sparse has rows to send)
    python bench/gpu_check.py --workload mlp --steps 4
    python bench/gpu_check.py --device cpu    # the same checks on CPU/gloo: tests the script where no GPU is
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402


def strategies(embeddings: list[str], world: int, hosts: int) -> dict[str, dict]:
    """One strategy per registry entry: each plan alone, each compressor over all-reduce, each sync mode
    (selective with one island per host: on one host, one island of every rank)."""
    from autosync import plans

    out: dict[str, dict] = {"ddp_default": {}}
    for name, plan in plans.PLANS.items():
        if name == "allreduce":
            continue
        if plan.embeddings_only:
            if embeddings:
                out[f"plan {name}"] = {"groups": [{"match": embeddings, "plan": name}, {"match": "*"}]}
            continue
        group = {"match": "*", "plan": name}
        if "partitions" in plan.fields:
            group["partitions"] = world
        out[f"plan {name}"] = {"groups": [group]}
    for name, comp in plans.COMPRESSORS.items():
        if not comp.identity:
            out[f"compressor {name}"] = {"groups": [{"match": "*", "compressor": name}]}
    for name, mode in plans.SYNC_MODES.items():
        if name == "selective":
            out[f"sync {name}"] = {"sync": {"mode": name, "islands": [[h] for h in range(hosts)]}}
        elif name != "bsp":
            out[f"sync {name}"] = {"sync": {"mode": name}}
    out["zero"] = {"optimizer_sharding": "zero"}
    return out


def check(pool, workload: str, batch: int, steps: int, label: str) -> list[dict]:
    from autosync import workloads
    from autosync.executor.measure import TrialSpec, measure, params_close
    from autosync.strategy import Strategy

    model, _ = workloads.build(workload)
    embeddings = sorted(workloads.embedding_parameter_names(model))
    rows = []
    ref_spec = TrialSpec(workload, Strategy.default().canonical(), batch, 1, steps, record_params=True,
                         builtin_ddp=True)
    ref, ref_params = measure(pool, ref_spec, timeout=600)
    rows.append({"setup": label, "what": "plain DDP (reference)", "status": ref.status, "lossy": "no",
                 "samples_per_s": ref.samples_per_s, "equal": "-", "reason": ref.reason})
    for what, raw in strategies(embeddings, pool.world_size, pool.world_size // pool.ranks_per_host).items():
        t0 = time.monotonic()
        try:
            s = Strategy.from_dict(raw)
            spec = TrialSpec(workload, s.canonical(), batch, 1, steps, record_params=True)
            r, params = measure(pool, spec, timeout=600)
        except Exception as e:  # noqa: BLE001 - a strategy this script cannot build is its own failing row
            rows.append({"setup": label, "what": what, "status": "failed", "lossy": "-", "samples_per_s": 0.0,
                         "equal": "-", "reason": f"{type(e).__name__}: {e}"[:160], "wall_s": time.monotonic() - t0})
            print(f"  {label:<10} {what:<28} failed  -    {rows[-1]['reason'][:100]}", flush=True)
            continue
        equal = "-"
        if r.ok and s.is_lossless and ref_params is not None and params is not None:
            off = params_close(ref_params, params, rtol=1e-4, atol=1e-5)
            equal = "yes" if not off else f"NO ({len(off)} tensors, e.g. {off[0]})"
        if r.ok and not all(math.isfinite(x) for x in r.losses):
            r.status, r.reason = "failed", "non-finite loss"
        rows.append({"setup": label, "what": what, "status": r.status, "lossy": "no" if s.is_lossless else "yes",
                     "samples_per_s": r.samples_per_s, "equal": equal, "reason": r.reason[:160],
                     "wall_s": time.monotonic() - t0})
        print(f"  {label:<10} {what:<28} {r.status:<7} {equal:<4} {r.reason[:100]}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="gpt2-tiny")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None, help="result file (default bench/results/gpu_check.md; with --device cpu, "
                                                 "none unless given)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: run the same checks on CPU tensors over gloo, to test this script without a GPU")
    args = ap.parse_args()

    import torch

    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
              f"nothing checked", file=sys.stderr)
        return 2
    from autosync import workloads
    from autosync.cluster import parse_cluster
    from autosync.executor.device import describe
    from autosync.executor.launch import RankPool
    from autosync.profiler.measure import run_profile

    batch = args.batch_size or workloads.default_batch_size(args.workload)
    gpus = 0 if cpu else torch.cuda.device_count()
    facts = {"device_name": "cpu (script check, no GPU)", "cuda": None, "nccl": None} if cpu else describe("cuda:0")
    print(f"gpu_check: {gpus} x {facts['device_name']}, CUDA {facts['cuda']}, NCCL {facts['nccl']}, "
          f"torch {torch.__version__}", flush=True)
    rows, profiles = [], []
    setups = (("gloo+cpu", 2, "gloo"),) if cpu else (("nccl", gpus, "nccl"), ("gloo+cuda", 2, "gloo"))
    for label, world, backend in setups:
        with RankPool(world, backend=backend, device=args.device, network="unshaped") as pool:
            try:
                rows += check(pool, args.workload, batch, args.steps, label)
                prof = run_profile(pool, parse_cluster(f"1x{world}@100gbit"), args.workload, batch, timeout=900)
                m, ar = prof.model, prof.network.fits["world"]["all_reduce"]
                profiles.append(f"| {label} | {world} | {prof.env.get('device')} | {m.forward_s * 1e3:.2f} | "
                                f"{m.backward_s * 1e3:.2f} | {m.optimizer_s * 1e3:.2f} | {m.peak_mem_mb:,.0f} | "
                                f"{ar.alpha_s * 1e6:,.0f} | {ar.bandwidth_bps / 1e9:,.1f} |")
            except Exception as e:  # noqa: BLE001 - a set-up that cannot start is a finding
                rows.append({"setup": label, "what": "(set-up)", "status": "failed", "lossy": "-",
                             "samples_per_s": 0.0, "equal": "-", "reason": f"{type(e).__name__}: {e}"[:200]})
    bad = [r for r in rows if r["status"] != "ok" or str(r["equal"]).startswith("NO")]
    lines = ["# GPU check", "",
             f"{gpus} x {facts['device_name']}, CUDA {facts['cuda']}, NCCL {facts['nccl']}, torch {torch.__version__}; "
             f"workload {args.workload}, batch {batch}/rank, {args.steps} timed steps after 1 warm-up.", "",
             "| set-up | strategy | lossy | status | equal to plain DDP | samples/s | reason |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setup']} | {r['what']} | {r['lossy']} | {r['status']} | {r['equal']} | "
                     f"{r['samples_per_s']:,.0f} | {r['reason'].replace('|', '/')} |")
    lines += ["", f"Profiler on {args.device} (synchronized phases; on CUDA, gradient-ready times from CUDA events):", "",
              "| set-up | ranks | device | forward ms | backward ms | optimizer ms | peak MB | all-reduce alpha us | "
              "all-reduce GB/s (bits) |", "|---|---|---|---|---|---|---|---|---|", *profiles, "",
              f"{len(rows) - len(bad)} of {len(rows)} rows pass." + (f" Failing: {', '.join(r['setup'] + ' ' + r['what'] for r in bad)}." if bad else "")]
    print("\n".join(lines[2:]))
    out = args.out or (None if cpu else str(_results.RESULTS / "gpu_check.md"))
    if out:
        print(f"-> {_results.write(out, lines)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
