"""Bad command lines, table-driven across every subcommand: exit 2, one line, no traceback."""
import subprocess
import sys

import pytest

from conftest import cli

F = "tests/fixtures/faulty.py"
CASES = [
    # (argv, expected text in the one line)
    ([], "the following arguments are required: COMMAND"),
    (["explode"], "invalid choice: 'explode'"),
    (["-v", "bogus"], "invalid choice: 'bogus'"),
    # run
    (["run"], "required: --workload"),
    (["run", "--workload", "mlp", "--nproc", "-2"], "--nproc: expected a positive integer"),
    (["run", "--workload", "mlp", "--nproc", "two"], "--nproc: expected a positive integer, got 'two'"),
    (["run", "--workload", "mlp", "--steps", "0"], "--steps: expected a positive integer, got 0"),
    (["run", "--workload", "mlp", "--warmup", "-1"], "--warmup: expected an integer >= 0"),
    (["run", "--workload", "mlp", "--seed", "x"], "--seed: expected an integer >= 0"),
    (["run", "--workload", "mlp", "--timeout", "0"], "--timeout: expected a positive number"),
    (["run", "--workload", "mlp", "--batch-size", "0"], "--batch-size: expected a positive integer"),
    (["run", "--workload", "mlp", "--cluster", "3x@1gbit"], "expected NODESxRANKS@BANDWIDTH"),
    (["run", "--workload", "mlp", "--cluster", "2x1@1gbit", "--nproc", "3"], "--nproc 3 disagrees with --cluster"),
    (["run", "--workload", "mlp", "--cluster", "2x1@1gbit", "--ranks-per-host", "1"], "comes from --cluster"),
    (["run", "--workload", "no.such.module:fn"], "cannot import module 'no.such.module'"),
    (["run", "--workload", "missing.py:fn"], "file missing.py does not exist"),
    (["run", "--workload", f"{F}:nothing_here"], "has no function 'nothing_here'"),
    (["run", "--workload", "mlp", "--json", "--bogus"], "unrecognized arguments: --bogus"),
    # profile
    (["profile"], "required: --workload/--model, --cluster"),
    (["profile", "--workload", "mlp"], "required: --cluster"),
    (["profile", "--workload", "mlp", "--cluster", "2x1@0.5mbit"], "outside 1mbit..100gbit"),
    (["profile", "--workload", "mlp", "--cluster", "2x1@1gbit,5s"], "is over 1 s"),
    (["profile", "--workload", "nope", "--cluster", "2x1@1gbit"], "unknown workload 'nope'"),
    (["profile", "--workload", "mlp", "--cluster", "2x1@1gbit", "--timeout", "-1"], "--timeout: expected a positive"),
    # output paths are checked before any work starts
    (["profile", "--workload", "mlp", "--cluster", "2x1@1gbit", "--out", "/nonexistent/dir/p.json"],
     "folder /nonexistent/dir does not exist"),
    (["profile", "--workload", "mlp", "--cluster", "2x1@1gbit", "--out", "/"], "(it is a folder)"),
    (["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--out", "/nonexistent/s.yaml"], "does not exist"),
    (["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--plot", "/nonexistent/p.png"], "does not exist"),
    (["evaluate", "--plot", "/nonexistent/t.png"], "does not exist"),
    (["train", "--out", "/etc/hostname"], "(a file, not a folder)"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1@1gbit", "--data", "/etc/hostname"], "a file, not a folder"),
    # collect
    (["collect"], "required: --workloads, --clusters"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1"], "expected NODESxRANKS@BANDWIDTH"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1@1gbit", "--per-context", "-5"], "--per-context"),
    (["collect", "--workloads", "nope", "--clusters", "2x1@1gbit"], "unknown workload 'nope'"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1@1gbit", "--budget", "0"], "--budget: expected a positive"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1@1gbit;node5=1mbit"], "node5 does not exist"),
    (["collect", "--workloads", "mlp", "--clusters", "2x1@1gbit", "--modes", "diloco", "dilocco"],
     "--modes: unknown sync mode(s) 'dilocco'; known: bsp"),
    (["efficiency", "--data", "shipped", "--modes", "nope"], "--modes: unknown sync mode(s) 'nope'"),
    # train
    (["train", "--data", "/no/such/dir"], "no dataset here"),
    (["train", "--kind", "forest"], "invalid choice: 'forest'"),
    (["train", "--seed", "-1"], "--seed: expected an integer >= 0"),
    # evaluate
    (["evaluate", "--data", "/no/such/dir"], "no dataset here"),
    (["evaluate", "--split", "random"], "invalid choice: 'random'"),
    # tune
    (["tune", "--cluster", "2x1@1gbit"], "one of the arguments --workload --model is required"),
    (["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--measure", "lots"], "--measure: expected an integer"),
    (["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--storage", "::"], "is not a database URL"),
    (["tune", "--workload", "mlp", "--cluster", "2x1@1gbit", "--candidates", "-1"], "--candidates"),
    (["tune", "--workload", "mlp", "--cluster", "0x1@1gbit"], "must be at least 1"),
    (["tune", "--model", "mlp", "--cluster", "2x1@1gbit", "--measure", "0", "--cost-model", "/none"],
     "cannot read model card"),
    (["tune", "--workload", "mlp", "--cluster", "2x8@25gbit", "--measure", "2"],
     "beyond what this machine emulates faithfully (16 ranks on"),
    (["tune", "--workload", "mlp", "--cluster", "2x8@25gbit", "--measure", "2"], "predict it instead with --measure 0"),
    (["collect", "--workloads", "mlp", "--clusters", "2x8@1gbit"], "pass --beyond-range to measure it anyway"),
    # cluster
    (["cluster"], "required: ACTION"),
    (["cluster", "check"], "required: SPEC"),
    (["cluster", "check", "2x1@1gbit,loss=200%"], "loss must be below 100%"),
    (["cluster", "check", "1x2@1gbit"], "has one host: there is no host link to measure"),
    (["cluster", "sweep", "--everything"], "unrecognized arguments: --everything"),
    # bench
    (["bench", "nope"], "unknown benchmark 'nope'"),
]


#: run as real processes too (the rest in this process: the same code path, without an interpreter start each)
AS_PROCESS = [[], ["profile", "--workload", "mlp", "--cluster", "2x1@1gbit", "--out", "/nonexistent/dir/p.json"],
              ["tune", "--model", "mlp", "--cluster", "2x1@1gbit", "--measure", "0", "--cost-model", "/none"]]


@pytest.mark.parametrize("i, argv, message", [(i, *c) for i, c in enumerate(CASES)],
                         ids=[" ".join(c[0])[:60] or "<none>" for c in CASES])
def test_bad_command_line(i, argv, message, tmp_path):
    cwd = tmp_path if argv[:1] in (["tune"], ["collect"]) else None
    if argv in AS_PROCESS:
        out = subprocess.run([sys.executable, "-m", "autosync.cli", *argv], capture_output=True, text=True,
                             timeout=120, cwd=cwd)
    else:
        out = cli(*argv, cwd=cwd)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_every_subcommand_has_bad_command_lines_and_some_run_as_processes():
    from autosync.present.commands import COMMANDS

    assert {c[0][0] for c in CASES if c[0]} >= {name.split()[0] for name in COMMANDS} - {"workloads", "merge",
                                                                                          "efficiency"}
    assert all(argv in [c[0] for c in CASES] for argv in AS_PROCESS)


#: every command that opens ranks on an emulated cluster, given one whose network cannot be brought up
OPENS_RANKS = [
    ["run", "--workload", "mlp", "--cluster", "{spec}"],
    ["profile", "--workload", "mlp", "--cluster", "{spec}", "--out", "p.json"],
    ["collect", "--workloads", "mlp", "--clusters", "{spec}", "--per-context", "0"],
    ["tune", "--workload", "mlp", "--cluster", "{spec}", "--measure", "2", "--storage", "sqlite:///t.db"],
    ["cluster", "check", "{spec}"],
]


@pytest.mark.parametrize("argv", OPENS_RANKS, ids=[a[0] if a[0] != "cluster" else "cluster check" for a in OPENS_RANKS])
def test_every_command_that_opens_ranks_refuses_a_cluster_it_cannot_emulate_in_one_line(argv, tmp_path, monkeypatch):
    """A cluster the emulator fails to bring up is one line (exit status 2), from every command. The failure is
    real: a delay line (a link with a latency) given no time to start, which the emulator reports; without root,
    the emulator is refused before that."""
    from autosync.executor import emulate

    monkeypatch.setattr(emulate, "KEEPER_START_S", 0.0)
    monkeypatch.setattr(emulate, "has_netem", lambda: False)     # where netem exists the delay line is not used
    spec = "2x1@100mbit,1ms"
    out = cli(*[spec if a == "{spec}" else a for a in argv], cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"cannot emulate {spec}" in lines[0], lines[0]
    if emulate.can_emulate()[0]:
        assert "a delay line of 2x1@100mbit,1ms did not start" in lines[0], lines[0]
    assert emulate.list_namespaces() == [] or not any(n.startswith(f"{emulate.PREFIX}{__import__('os').getpid()}-")
                                                       for n in emulate.list_namespaces())
