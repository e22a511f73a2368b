"""Shared helpers: every test that starts ranks checks that none of them outlives it."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: The tunes of the tests score 100 candidates, not the CLI's 500 (about 10 s less each): what they test is not the
#: search's breadth.
FEW_CANDIDATES = ("--candidates", "100")
#: The 17k-parameter test model (fast trials), by absolute path: commands run in their tests' temp dirs.
SMALL = str(Path(__file__).resolve().parent / "fixtures" / "small.py") + ":build"


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="show the N tests that took the most CPU time (theirs and their finished children's, "
                          "setup to teardown): on a busy machine wall time says little")


def _cpu_s() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item._cpu_start = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown" and hasattr(item, "_cpu_start"):
        report.user_properties.append(("cpu_s", _cpu_s() - item._cpu_start))


_CPU: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _CPU.update({report.nodeid: v for k, v in report.user_properties if k == "cpu_s"})


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-durations")
    if n and _CPU:
        terminalreporter.write_sep("=", f"most CPU: {n} of {len(_CPU)} tests ({sum(_CPU.values()):.0f} s in all)")
        for nodeid, s in sorted(_CPU.items(), key=lambda t: -t[1])[:n]:
            terminalreporter.write_line(f"{s:7.1f}s cpu  {nodeid}")


def pytest_collection_modifyitems(items):
    """The tests marked slow first (a stable sort: the rest keep their order): pytest-xdist hands tests out in this
    order, so the long ones spread over the workers at the start instead of one of them running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pids_alive(pids):
    """The ones of ``pids`` still running (a zombie, dead but not yet reaped, is not)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:   # a short-lived process that ended meanwhile
        return b""


def _parents():
    """{pid: parent pid} of every live, non-zombie process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(entry)] = int(fields[1])
    return out


def is_rank(pid, parents=None):
    """A rank process: a multiprocessing spawn child, or a fork of multiprocessing's forkserver (whose own command
    line it shares; the forkserver itself, a child of its launcher, is not a rank)."""
    cmd = _cmdline(pid)
    if b"spawn_main" in cmd:
        return True
    parent = (parents or _parents()).get(pid)
    return b"multiprocessing.forkserver" in cmd and parent is not None and \
        b"multiprocessing.forkserver" in _cmdline(parent)


def rank_pids(root=None):
    """The rank processes descended from ``root`` (default: this test process), however deep."""
    parents = _parents()
    children = {}
    for c, p in parents.items():
        children.setdefault(p, []).append(c)
    found, todo = [], [root or os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            if is_rank(c, parents):
                found.append(c)
    return found


@pytest.fixture
def no_leftover_ranks():
    """Fails the test if a rank process it started is still running afterwards."""
    before = set(rank_pids())
    yield
    left = [p for p in rank_pids() if p not in before]
    assert not pids_alive(left), f"rank processes left running: {left}"


def processes_under(path):
    """PIDs (other than this one) whose working directory is ``path`` or inside it: a CLI run with cwd=path
    and every rank it spawned (ranks inherit the working directory)."""
    path, out = str(os.path.realpath(path)), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (cwd == path or cwd.startswith(path + os.sep)):
                out.append(int(entry))
    return out


def orphaned(namespace):
    """A namespace whose creating process is gone, or is this one: a test running beside this one (pytest-xdist)
    owns live ones."""
    from autosync.executor.emulate import _NAME
    from autosync.executor.launch import pid_alive

    m = _NAME.match(namespace)
    return m is None or int(m.group(1)) == os.getpid() or not pid_alive(int(m.group(1)))


@pytest.fixture
def nothing_left(tmp_path):
    """A check that no process running in tmp_path (a CLI run and its ranks) and no namespace of ours created
    during the test is left; called by the test when it likes, and once more at teardown."""
    from autosync.executor.emulate import list_namespaces

    before = set(list_namespaces())

    def check():
        deadline = time.monotonic() + 5
        while processes_under(tmp_path) and time.monotonic() < deadline:  # a dying process may need a moment
            time.sleep(0.2)
        assert processes_under(tmp_path) == [], "processes of this test left running"
        left = {n for n in set(list_namespaces()) - before if orphaned(n)}
        assert left == set(), "namespaces of this test left behind"

    yield check
    check()


@pytest.fixture
def store_with_profile():
    """``make(root, workload, cluster)``: a dataset folder holding the context's (nominal) profile, filed as the
    emulated one, so that commands start measuring at once instead of profiling first."""
    from autosync.cluster import parse_cluster
    from autosync.datasets.store import DatasetStore
    from autosync.profiler.measure import nominal_profile

    def make(root, workload, cluster):
        store = DatasetStore(root)
        profile = nominal_profile(parse_cluster(cluster), workload)
        profile.env["network"] = "emulated"
        store.save_profile(profile.context_id, profile.to_dict())
        return store

    return make


@pytest.fixture(scope="session")
def tuned(tmp_path_factory, worker_id):
    """A tuned lossless strategy file per workload (the cost model's pick for a 2-host 1 gbit cluster), made once per
    `make test` for the frameworks' tests and the example script's: pytest-xdist's workers share a folder (their
    temp dirs' parent), and the first to ask for a workload tunes it while the others wait on its lock and read the
    same file (resnet-tiny serves three tests). The tune
    reads the shipped dataset's profile of the context (`--profile`) instead of profiling the model again (~15 s of
    CPU each): profiling is tested elsewhere."""
    from filelock import FileLock

    from autosync import workloads
    from autosync.cluster import parse_cluster
    from autosync.context import Context
    from autosync.datasets.store import DatasetStore
    from autosync.datasets import SHIPPED_DATA

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent

    def get(workload):
        d = shared / f"tuned-{workload}"
        with FileLock(f"{d}.lock"):
            if not (d / "s.yaml").exists():
                d.mkdir(exist_ok=True)
                context = Context.of(workload, workloads.default_batch_size(workload), parse_cluster("2x1@1gbit"))
                profile = DatasetStore(SHIPPED_DATA, create=False).profile_path(context.id)
                out = subprocess.run([sys.executable, "-m", "autosync.cli", "tune", "--workload", workload,
                                      "--cluster", "2x1@1gbit", "--measure", "0", "--lossless", *FEW_CANDIDATES,
                                      "--profile", str(profile),
                                      "--out", "s.yaml", "--data", "d", "--storage", f"sqlite:///{d}/t.db"],
                                     cwd=d, capture_output=True, text=True, timeout=300)
                assert out.returncode == 0, out.stderr[-2000:]
        return d / "s.yaml"
    return get


def cli(*argv, cwd=None):
    """``autosync ARGV`` in this process (a bad command line fails before any work: no interpreter start-up,
    no torch import per case); a CompletedProcess with its exit status and what it printed."""
    import contextlib
    import io
    import os
    import signal
    import subprocess

    from autosync.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_dir, old_term = os.getcwd(), signal.getsignal(signal.SIGTERM)
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(old_dir)
        signal.signal(signal.SIGTERM, old_term)
    return subprocess.CompletedProcess(["autosync", *argv], code, out.getvalue(), err.getvalue())
