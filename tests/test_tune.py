"""`autosync tune`: shared PostgreSQL studies, strategies that run, bad input."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from autosync.datasets.store import DatasetStore
from autosync.executor.emulate import can_emulate
from autosync.executor.launch import free_port
from conftest import FEW_CANDIDATES, SMALL, cli


PG_BIN = Path("/usr/lib/postgresql/15/bin")
pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def autosync(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "autosync.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture
def postgres():
    """A real PostgreSQL server in a temp dir, as user postgres, on its own port; stopped afterwards."""
    if not (PG_BIN / "initdb").exists() or os.geteuid() != 0:
        pytest.skip("needs the PostgreSQL 15 server binaries and root")
    root = Path(tempfile.mkdtemp(prefix="autosync-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    shutil.chown(root, "postgres")
    shutil.chown(sock, "postgres")
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(as_pg + [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True)
    subprocess.run(as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    try:
        subprocess.run(as_pg + [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "autosync"],
                       check=True, capture_output=True)
        yield f"postgresql://postgres@127.0.0.1:{port}/autosync"
    finally:
        subprocess.run(as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
def test_two_workers_on_one_postgres_study_measure_disjoint_strategies_and_learn_from_each_other(postgres, tmp_path,
                                                                                                 store_with_profile):
    """Worker B starts once A's DDP default is in the shared study: B must not measure what A measured or is
    measuring (the default included), and B's proposals must come from a model refit on A's measurements."""
    def worker(name, seed):
        return subprocess.Popen([sys.executable, "-m", "autosync.cli", "tune", "--model", SMALL, "--cluster",
                                 "2x1@1gbit", "--measure", "2", "--objective", "throughput",
                                 "--confirm-rounds", "0", *FEW_CANDIDATES, "--storage", postgres, "--seed", str(seed),
                                 "--timeout", "60", "--out", str(tmp_path / f"{name}.yaml"),
                                 "--data", str(tmp_path / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def measured():
        names = [s.study_name for s in optuna.get_all_study_summaries(postgres)]
        if not names:
            return []
        return [t for t in optuna.load_study(study_name=names[0], storage=postgres).get_trials()
                if t.user_attrs.get("kind") == "measured"]

    for name in ("a", "b"):
        store_with_profile(tmp_path / name, SMALL, "2x1@1gbit")   # profiling is tested elsewhere: save its time
    a = worker("a", 1)
    deadline = time.monotonic() + 240
    while not any(t.user_attrs.get("source") == "ddp_default" and t.state.is_finished() for t in measured()):
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()[1][-2000:]
        time.sleep(1)
    b = worker("b", 2)
    outs = [p.communicate(timeout=400) for p in (a, b)]
    assert [a.returncode, b.returncode] == [0, 0], [o[1][-2000:] for o in outs]

    assert len(optuna.get_all_study_summaries(postgres)) == 1, "both workers must use one study"
    trials = [t for t in measured() if t.state.is_finished()]
    hashes = [t.user_attrs["hash"] for t in trials]
    assert len(hashes) == len(set(hashes)) == 4, hashes               # 2 each, none measured twice
    a_rows = DatasetStore(tmp_path / "a").read()
    b_rows = DatasetStore(tmp_path / "b").read()
    assert len(a_rows) == len(b_rows) == 2 and set(a_rows.strategy_hash).isdisjoint(b_rows.strategy_hash)
    assert "ddp_default" in set(a_rows.source) and "ddp_default" not in set(b_rows.source)   # B used A's
    b_worker = {t.user_attrs["worker"] for t in trials if t.user_attrs["hash"] in set(b_rows.strategy_hash)}
    assert len(b_worker) == 1
    b_claims = [t for t in trials if t.user_attrs["worker"] in b_worker]
    assert all(t.user_attrs["peer_measurements_seen"] >= 1 for t in b_claims)   # conditioned on A's results
    assert "learned from" in outs[1][0] and "speedup" in outs[1][0]


def test_unreachable_storage_is_one_line_exit_2_before_any_profiling(tmp_path):
    port = free_port()
    out = autosync("tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--measure", "2", "--unshaped", "--storage",
                   f"postgresql://nobody@127.0.0.1:{port}/none", "--out", str(tmp_path / "s.yaml"),
                   "--data", str(tmp_path / "d"))
    assert out.returncode == 2 and "cannot open Optuna storage" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("d/profiles/*.json")), "the storage is checked before the long work"


@pytest.mark.slow
@pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
def test_a_tuned_strategy_runs_with_autosync_run_and_the_example_script(tmp_path, tuned):
    """The file `tune` wrote (the frameworks' tests' tuned file of resnet-tiny: one tune less in the suite; a tune
    with measurements is checked by the time-to-loss test) runs with `autosync run` and the example script."""
    strategy = tuned("resnet-tiny")
    text = strategy.read_text()
    assert text.startswith("# autosync tune: resnet-tiny") and "autosync: 1" in text
    run = autosync("run", "--workload", "resnet-tiny", "--cluster", "2x1@1gbit", "--strategy", str(strategy),
                   "--steps", "3", "--json", cwd=tmp_path)
    assert run.returncode == 0 and '"status": "ok"' in run.stdout, run.stderr
    repo = Path(__file__).resolve().parent.parent
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(free_port()), str(repo / "examples" / "train_with_strategy.py"), "--strategy",
                str(strategy), "--workload", "resnet-tiny", "--steps", "4"]
    example = subprocess.run(torchrun, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "TMPDIR": str(tmp_path)})   # torchrun leaves torchelastic_* there
    assert example.returncode == 0, example.stderr[-2000:]
    assert "trained 4 steps on 2 ranks" in example.stdout


BAD = [
    (["--workload", "mlp", "--cluster", "2x1@1gbit", "--measure", "-1"], "--measure: expected an integer >= 0"),
    (["--workload", "mlp", "--cluster", "2x1@fast"], "needs a number and a unit"),
    (["--workload", "mlp", "--cluster", "2x1@1gbit", "--storage", "::nonsense::"], "is not a database URL"),
    (["--workload", "nope", "--cluster", "2x1@1gbit"], "unknown workload 'nope'"),
    (["--model", "json:no_fn", "--cluster", "2x1@1gbit"], "json has no function 'no_fn'"),
    (["--model", "tests/fixtures/faulty.py:no_parameters", "--cluster", "2x1@1gbit"], "no trainable parameters"),
    (["--workload", "mlp", "--model", "x:y", "--cluster", "2x1@1gbit"], "not allowed with argument"),
    (["--workload", "mlp"], "tune needs --cluster (or --in-job, which takes the job's own shape and measures its links)"),
    (["--workload", "mlp", "--cluster", "2x1@1gbit", "--candidates", "0"], "--candidates: expected a positive"),
    (["--workload", "mlp", "--cluster", "2x1@1gbit", "--measure", "0", "--cost-model", "/no/such/dir"],
     "cannot read model card"),
    (["--workload", "mlp", "--cluster", "2x1@1gbit", "--batch-size", "x"], "--batch-size: expected a positive"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[b[1][:30] for b in BAD])
def test_tune_bad_input_is_one_line_exit_2(tmp_path, args, message):
    out = cli("tune", *args, "--out", str(tmp_path / "s.yaml"), "--data", str(tmp_path / "d"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_python_api_tunes_a_model_object_for_a_cluster_we_do_not_have(tmp_path, monkeypatch):
    import autosync

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    import small

    out = tmp_path / "s.yaml"
    strategy = autosync.tune(small.Net(), small.make_batch, cluster="2x8@25gbit", measure=0,
                             storage=f"sqlite:///{tmp_path}/t.db", data=tmp_path / "d", out=out)
    assert isinstance(strategy, autosync.Strategy)
    text = out.read_text()
    assert autosync.load_strategy(out) == strategy and "predicted" in text
    # zero-shot: the pick's calibrated interval and rule, the nearest dataset contexts, and 2x8 (a shape the dataset
    # never saw) flagged
    assert "80% interval" in text and "picked by the point estimate" in text, text
    assert "# nearest dataset contexts:" in text and "OUT OF DISTRIBUTION: cluster shape 2x8" in text, text
    with pytest.raises(autosync.UserError, match="make_batch must be picklable"):
        autosync.tune(small.Net(), lambda b, g: {}, cluster="2x1@1gbit", measure=0)


@pytest.mark.slow
@pytest.mark.skipif(not can_emulate()[0], reason="cannot emulate here")
def test_time_to_loss_measures_the_efficiency_of_lossy_finalists_before_picking(tmp_path):
    from autosync.datasets.store import DatasetStore

    fixture = Path(__file__).parent / "fixtures" / "small.py"
    # on unshaped loopback: what is tested is the objective's logic, and profiling loopback takes seconds, not 30
    out = autosync("tune", "--model", f"{fixture}:build_wide", "--cluster", "2x1@1gbit", "--measure", "4", "--unshaped",
                   "--confirm-rounds", "1", *FEW_CANDIDATES, "--out", "s.yaml", "--data", "d", "--storage", f"sqlite:///{tmp_path}/t.db",
                   cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "s.yaml").read_text()
    assert "recommended:" in out.stdout and (tmp_path / "s.png").exists()
    assert text.startswith("# autosync tune: ") and "autosync: 1" in text
    assert "objective: time-to-loss" in text and "efficiency" in out.stdout
    assert "# measured (speedup = throughput over the DDP default; time = speedup x efficiency" in text
    eff = DatasetStore(tmp_path / "d").read_efficiency()
    assert (eff.lossy_key == "lossless").sum() == 2, "two reference seeds give the noise band"
    lossy = eff[eff.lossy_key != "lossless"]
    assert len(lossy) >= 1 and (lossy.status == "ok").all(), lossy[["status", "reason"]].to_dict("records")
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/t.db")[0].study_name,
                              storage=f"sqlite:///{tmp_path}/t.db")   # what Optuna's dashboard shows
    assert study.metric_names == ["samples/s"] and study.user_attrs["objective"] == "time-to-loss"
    assert study.user_attrs["pick"]["hash"] in text and study.user_attrs["efficiency"]
    done = [t for t in study.trials if t.user_attrs.get("kind") == "measured" and t.state.is_finished()]
    assert done and all({"summary", "yaml", "speedup", "status", "lossless"} <= set(t.user_attrs) for t in done)
    report = (tmp_path / "s.html").read_text()      # the report beside the strategy file, self-contained
    assert "Every measured strategy" in report and "src='data:image/png;base64," in report and "http" not in report
    assert report.count("data:image/png") == 2, "predicted-vs-measured and loss-against-time plots"
    picked_lossy = "# LOSSY: statistical efficiency" in text
    assert picked_lossy == ("# lossless: false" in text)
    if picked_lossy:
        assert "measured" in text.split("# LOSSY: statistical efficiency")[1].splitlines()[0]


def test_a_tune_config_holds_every_default_and_checks_every_choice():
    """TuneConfig is the one home of a tune's defaults: the CLI's options are built from its fields, and a bad
    choice is one line before any work."""
    from autosync.cli import build_parser
    from autosync.errors import UserError
    from autosync.search.config import TuneConfig

    args = build_parser().parse_args(["tune", "--workload", "mlp", "--cluster", "2x1@1gbit"])
    config = TuneConfig.build(lossless=args.lossless, **{n: getattr(args, n) for n, _ in TuneConfig.options()})
    assert config == TuneConfig()                        # the CLI's defaults are the config's
    assert TuneConfig.build(lossless=True).objective == "lossless" and TuneConfig.build(lossless=True).lossless
    for choices, message in (({"objective": "speed"}, "objective 'speed' is not one of"),
                             ({"zero_shot": "mean"}, "zero_shot 'mean' is not one of"),
                             ({"measure": -1}, "measure must be an integer >= 0"),
                             ({"candidates": 0}, "candidates must be a positive integer"),
                             ({"storage": "::"}, "is not a database URL"),
                             ({"lossless": True, "objective": "throughput"}, "contradicts"),
                             ({"measures": 3}, "unknown tune option(s): measures")):
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            TuneConfig.build(**choices)


def test_an_efficiency_says_what_it_is_measured_with_its_rule_or_predicted():
    """A measured efficiency whose band stayed wide is decided by its lower bound and says so, with its raw ratio,
    band and seed pairs (it once printed "1.00 [0.18-0.86] measured": a 1.0 the noise rule made up, outside its
    own band); a resolved one reads as its raw ratio; a predicted one says predicted."""
    from autosync.present.text import efficiency_text
    from autosync.search.result import Measured
    from autosync.strategy import Strategy

    lossy = Strategy.from_dict({"groups": [{"compressor": {"name": "powersgd", "rank": 1}}]})

    def m(**kw):
        return Measured("tune", lossy, 1.0, "ok", 10.0, **kw)

    wide = efficiency_text(m(efficiency=0.18, efficiency_lo=0.18, efficiency_hi=0.86, efficiency_source="measured",
                             efficiency_raw=0.52, efficiency_band=0.65, efficiency_pairs=4, within_noise=True))
    assert wide.startswith("0.18 measured: the lower bound of raw 0.52 [0.18-0.86]"), wide
    assert "4 seed pairs" in wide and "+-15%" in wide
    assert efficiency_text(m(efficiency=0.88, efficiency_lo=0.87, efficiency_hi=0.89, efficiency_source="measured",
                             efficiency_raw=0.88, efficiency_band=0.01)) == "0.88 [0.87-0.89] measured (1 seed pair)"
    assert efficiency_text(m(efficiency=0.8, efficiency_source="predicted")) == "0.80 predicted"
    assert efficiency_text(Measured("d", Strategy.default(), 1.0, "ok", 10.0)) == "1 (lossless)"
