"""The `autosync` command as a user runs it: real subprocesses, exit codes, one-line errors (bad input in this
process: it fails before any work)."""
import json
import subprocess
import sys

import pytest

from conftest import SMALL, cli

FAULTS = "tests/fixtures/faulty.py"


def autosync(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "autosync.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_run_default_and_strategy_file_as_json(tmp_path):
    strategy = tmp_path / "s.yaml"
    strategy.write_text("groups: [{match: '*', plan: sharded_ps, partitions: 2}]\n")
    out = autosync("run", "--workload", "mlp", "--nproc", "2", "--steps", "3", "--warmup", "1",
                   "--strategy", str(strategy), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "ok" and result["world_size"] == 2 and result["samples_per_s"] > 0
    assert len(result["step_times"]) == 3 and result["cv"] >= 0 and result["peak_mem_mb"] > 0


def test_run_prints_a_table():
    out = autosync("run", "--workload", "resnet-tiny", "--nproc", "2", "--steps", "2", "--warmup", "1")
    assert out.returncode == 0, out.stderr
    assert "samples/s" in out.stdout and "step (median)" in out.stdout


def test_failed_trial_exits_1_with_reason():
    out = autosync("run", "--workload", f"{FAULTS}:abort_on_rank1", "--steps", "5", "--json", "--timeout", "30")
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["status"] == "failed" and "SIGABRT" in result["reason"]


def test_a_dead_rank_says_why_with_its_own_last_stderr_lines():
    out = autosync("run", "--workload", f"{FAULTS}:exit_on_rank1", "--steps", "5", "--json", "--timeout", "30")
    assert out.returncode == 1
    reason = json.loads(out.stdout)["reason"]
    assert "rank 1 died (exit code 3)" in reason and "scratch disk full" in reason, reason


def test_the_time_limit_bounds_the_ranks_start_too():
    """--timeout is the trial's limit; the ranks' own start (a fresh forkserver imports torch: well over 0.3 s) had a
    fixed 120 s of its own before, whatever the user asked. The limit counts from before the first rank's start,
    which waits while the forkserver imports torch: counted from after it, a start took under 0.3 s once (CI) and
    the trial timed out running instead."""
    out = autosync("run", "--workload", "mlp", "--steps", "2", "--json", "--timeout", "0.3")
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["status"] == "timeout" and "did not start within 0.3 s" in result["reason"], result


def test_the_api_called_at_import_time_names_the_cause(tmp_path):
    """Spawned ranks re-import the main module: a script without a __main__ guard must be told so."""
    script = tmp_path / "use_api.py"
    script.write_text("import autosync\n"
                      f"autosync.tune({SMALL!r}, cluster='2x1@1gbit', measure=1, unshaped=True, objective='throughput', "
                      f"data={str(tmp_path / 'd')!r}, storage={'sqlite:///' + str(tmp_path / 's.db')!r})\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode != 0
    assert "if __name__ == '__main__':" in out.stderr and "re-import the main module" in out.stderr, out.stderr[-2000:]


BAD = [
    (["run", "--workload", "mlp", "--strategy", "{bad}"], "malformed YAML", "groups: [{plan: ps}\n"),
    (["run", "--workload", "mlp", "--strategy", "{bad}"], "groups[0].plan: 'gossip' is not one of", "groups: [{plan: gossip}]"),
    (["run", "--workload", "mlp", "--strategy", "{bad}"], "groups[0].compressor.name: 'zip' is not one of",
     "groups: [{compressor: zip}]"),
    (["run", "--workload", "mlp", "--strategy", "{bad}"], "not covered by any group: net.4.weight",
     "groups: [{match: ['net.0.*', 'net.2.*']}]"),
    (["run", "--workload", "mlp", "--strategy", "{bad}", "--nproc", "2"], "rank 5 does not exist in a world of 2",
     "groups: [{plan: ps, placement: [5]}]"),
    (["run", "--workload", "mlp", "--strategy", "{bad}"], "row_sparse needs embedding tables",
     "groups: [{plan: row_sparse}]"),
    (["run", "--workload", "no-such-model"], "unknown workload 'no-such-model'", None),
    (["run", "--workload", "json:no_such_function"], "json has no function 'no_such_function'", None),
    (["run", "--workload", "no_such_pkg.mod:fn"], "cannot import module 'no_such_pkg.mod'", None),
    (["run", "--workload", f"{FAULTS}:no_parameters"], "the model has no trainable parameters", None),
    (["run", "--workload", f"{FAULTS}:bad_batch"], "make_batch raised ValueError: no data today", None),
    (["run", "--workload", "mlp", "--nproc", "0"], "--nproc: expected a positive integer, got 0", None),
    (["run", "--workload", "mlp", "--steps", "many"], "--steps: expected a positive integer, got 'many'", None),
    (["run", "--workload", "mlp", "--timeout", "-3"], "--timeout: expected a positive number", None),
    (["run", "--workload", "mlp", "--nproc", "4", "--ranks-per-host", "3"], "does not divide --nproc 4", None),
    (["run"], "the following arguments are required: --workload", None),
    (["fly"], "invalid choice: 'fly'", None),
    (["run", "--workload", "mlp", "--strategy", "auto", "--lossy-after", "-1"],
     "--lossy-after: expected an integer >= 0, got -1", None),
    (["run", "--workload", "mlp", "--strategy", "auto", "--objective", "fastest"], "invalid choice: 'fastest'", None),
    (["run", "--workload", "mlp", "--strategy", "/no/such/file.yaml"], "cannot read strategy file", None),
]


@pytest.mark.parametrize("args, message, strategy_text", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message, strategy_text):
    if strategy_text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(strategy_text)
        args = [str(path) if a == "{bad}" else a for a in args]
    out = cli(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_workloads_lists_every_builtin_with_its_batch():
    from autosync.workloads import BUILTINS

    out = subprocess.run([sys.executable, "-m", "autosync.cli", "workloads"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(BUILTINS)
    assert all(f"batch {BUILTINS[line.split()[0]].batch_size} " in line for line in lines)


def test_a_one_rank_profile_says_nothing_was_sent_instead_of_infinite_bandwidth():
    from autosync.present.tables import bandwidth_text as _bandwidth_text

    assert _bandwidth_text(8e8, 2) == "800 Mbit/s"
    assert _bandwidth_text(float("inf"), 1) == "nothing sent (1 rank)"
    assert "inf" not in _bandwidth_text(float("inf"), 4)


def test_help_and_bad_flags_answer_without_importing_torch():
    """`autosync --help`, every command's --help and a bad flag answer at once: building the parser imports no torch,
    pandas or optuna (tune's options come from TuneConfig, which imports them only when a tune runs)."""
    code = ("import sys, autosync.cli as c; c.build_parser()\n"
            "print(sorted(m for m in ('torch', 'pandas', 'optuna', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
    # and every command's --help renders (argparse formats each help with %: a bare "15%" once broke one)
    import argparse

    from autosync.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert len(commands) > 5
    for name, sub in commands.items():
        assert "usage: autosync" in sub.format_help(), name
        for nested in (a for a in sub._actions if isinstance(a, argparse._SubParsersAction)):
            for inner in nested.choices.values():
                assert "usage: autosync" in inner.format_help(), name
