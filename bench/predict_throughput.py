"""Cost-model prediction throughput on one core: LightGBM alone, and featurize + predict.

    python bench/predict_throughput.py  ->  bench/results/predict_throughput.md

``model`` rows time ``CostModel.predict`` on a batch of N candidates' features (the
shipped ranker and regressor, one thread). ``featurize + model`` times the whole scoring
path of `tune` on random strategies of one context (bert-mini), simulator included.
"""
import glob
import json
import time
from pathlib import Path

import numpy as np
import torch

from autosync.models.features import feature_matrix, featurize
from autosync.models.ranker import CostModel
from autosync.datasets import SHIPPED_DATA
from autosync.models.train import PRETRAINED
from autosync.profiler import Profile
from autosync.search.space import random_strategies
from _results import RESULTS, write as write_result


def rate(fn, n: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    lines = ["# Cost-model prediction throughput (one core)", "", "| what | batch | candidates/s |", "|---|---:|---:|"]
    profile = Profile.from_dict(json.loads(Path(sorted(glob.glob(str(SHIPPED_DATA / "profiles" / "bert*")))[0])
                                           .read_text()))
    strategies = random_strategies(profile, 500, seed=0)
    rows = [featurize(profile, s) for s in strategies]
    for kind in ("ranker", "regressor"):
        model = CostModel.load(PRETRAINED / kind)
        X = feature_matrix(rows, model.features)   # in the model's own column order
        for n in (1_000, 100_000):
            batch = X[rng.integers(0, len(X), n)]
            lines.append(f"| {kind}: model.predict | {n:,} | {rate(lambda: model.predict(batch), n):,.0f} |")
            print(lines[-1], flush=True)
    model = CostModel.load(PRETRAINED / "regressor")

    def end_to_end():
        model.score([featurize(profile, s) for s in strategies])

    lines.append(f"| featurize (simulator included) + regressor, bert-mini | {len(strategies)} | "
                 f"{rate(end_to_end, len(strategies), 1):,.0f} |")
    print(lines[-1])
    lines += ["", "Target: >= 50,000 candidates/s for the model."]
    write_result(RESULTS / "predict_throughput.md", lines)


if __name__ == "__main__":
    main()
