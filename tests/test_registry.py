"""One home per idea: plans, compressors and sync modes live in the registry, and everything iterates over it."""
import ast
import os
import re
from pathlib import Path

import pytest
import torch

from autosync import plans as registry
from autosync.cluster import parse_cluster
from autosync.models.features import featurize
from autosync.models.simulator import simulate
from autosync.plans.base import PlanDef
from autosync.profiler.measure import nominal_profile
from autosync.search.space import random_strategies
from autosync.strategy import Strategy, StrategyError

PKG = Path(__file__).resolve().parent.parent / "autosync"
REPO = PKG.parent


def _sources(*folders):
    for folder in folders:
        yield from (p for p in folder.rglob("*.py") if PKG / "plans" not in p.parents)


def test_no_string_dispatch_on_plan_compressor_or_mode_names_outside_the_registry():
    dispatch = re.compile(r"(\.plan|compressor\.name|comp|sync\.mode|\bmode)\s*(==|!=|\bin\b)\s*[\"'(\[]")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _sources(PKG, REPO / "bench")
             for i, line in enumerate(p.read_text().splitlines(), 1) if dispatch.search(line)]
    assert found == []


def test_the_cost_model_and_the_registry_import_nothing_from_the_executor():
    offenders = []
    for p in [*(PKG / "models").rglob("*.py"), *(PKG / "plans").rglob("*.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{p.name}: {n}" for n in names if n.startswith("autosync.executor")]
    assert offenders == []


def test_the_context_id_is_built_in_one_place():
    built = [f"{p.relative_to(REPO)}:{i}" for p in [*PKG.rglob("*.py"), *(REPO / "bench").rglob("*.py")]
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\|b\{", line)]
    assert [b.split(":")[0] for b in built] == ["autosync/context.py"], built


class AllGatherSum(PlanDef):
    """A new lossless plan, written the way a contributor would: all-gather every rank's segment, sum locally."""

    name = "allgather_sum"
    features = {"frac_plan_allgather_sum": 0.0}
    calls = 0

    def run(self, comm, t, seg, owners):
        import torch.distributed as dist

        AllGatherSum.calls += 1
        parts = [torch.empty_like(t) for _ in range(comm.world)]
        dist.all_gather(parts, t, group=comm.pg)
        t.copy_(torch.stack(parts).sum(0))

    def cost(self, sim, nbytes, shapes, touched, owners, elem_size, rows=()):
        return sim.t("all_gather", nbytes * sim.world)


@pytest.fixture
def with_new_plan(monkeypatch):
    monkeypatch.setitem(registry.PLANS, AllGatherSum.name, AllGatherSum())   # the "one line"
    return AllGatherSum


def test_a_new_plan_is_one_module_and_one_line(with_new_plan, tmp_path):
    profile = nominal_profile(parse_cluster("2x1@100mbit"), "mlp")
    new = Strategy.from_dict({"groups": [{"plan": "allgather_sum"}]})
    assert new.is_lossless
    with pytest.raises(StrategyError, match="only plan sharded_ps takes partitions"):
        Strategy.from_dict({"groups": [{"plan": "allgather_sum", "partitions": 2}]})
    # the simulator prices it by its own formula; the features see it; the search space offers it
    sim = simulate(profile, new)
    assert set(sim.bytes_per_plan) == {"allgather_sum"} and sim.step_s != simulate(profile, Strategy.default()).step_s
    assert featurize(profile, new)["frac_plan_allgather_sum"] == pytest.approx(1.0)
    assert any(g.plan == "allgather_sum" for s in random_strategies(profile, 40, 0) for g in s.groups)
    # and the one DDP hook runs it (a one-rank gloo group in this process)
    import torch.distributed as dist

    from autosync.executor.apply import apply, release
    from autosync.workloads import build

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model, make_batch = build("mlp", seed=0)
        ddp, opt = apply(model, torch.optim.SGD(model.parameters(), lr=0.1), new, init_sync=False)
        before = AllGatherSum.calls
        ddp(**make_batch(8, torch.Generator().manual_seed(0))).backward()
        release(ddp)
        assert AllGatherSum.calls > before
    finally:
        dist.destroy_process_group()


def test_every_registry_entry_documents_its_math():
    for entry in (*registry.PLANS.values(), *registry.COMPRESSORS.values(), *registry.SYNC_MODES.values()):
        doc = __import__(type(entry).__module__, fromlist=["_"]).__doc__ or ""
        assert entry.name in doc, f"{type(entry).__module__} does not document {entry.name}"
        if entry.name != "bsp":  # bsp adds nothing to the plans' costs
            assert "cost" in doc, f"{entry.name}: no cost formula in its docstring"


def test_a_new_compressor_with_a_new_field_is_one_module_and_one_line(tmp_path):
    """No monkeypatching: a copy of the package gets tests/fixtures/uniform_quantizer.py as a registry module and
    one line in the registry table; its field ``bits`` parses, validates, round-trips, is hashed, searched,
    featurized, priced and run by the hook, checked in a fresh interpreter on that copy."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "autosync"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("data", "v2", "__pycache__"))
    shutil.copy(REPO / "tests" / "fixtures" / "uniform_quantizer.py", copy / "plans" / "uniform_quantizer.py")
    table = copy / "plans" / "__init__.py"
    text = table.read_text()
    text = text.replace("ssp, topk)", "ssp, topk, uniform_quantizer)", 1)
    assert "uniform_quantizer)" in text
    table.write_text(text.replace("    topk.COMPRESSOR,\n)}", "    topk.COMPRESSOR,\n    uniform_quantizer.COMPRESSOR,\n)}"))
    assert "uniform_quantizer.COMPRESSOR" in table.read_text()     # the one line
    profile = PKG / "datasets" / "data" / "profiles" / "mlp_b128_2x1@100mbit.json"
    out = subprocess.run([sys.executable, str(REPO / "tests" / "fixtures" / "new_field_check.py"), str(profile),
                          str(copy), str(tmp_path / "store")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
