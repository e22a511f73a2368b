"""Run a command below everything else on this machine's CPU, and exit with its status.

    python tests/beside.py COMMAND [ARG ...]

`make test` runs the tests that time links and steps (marked serial) at normal priority, and the rest beside them
through this, so that the timed tests get a core whenever they want one and the rest take what they leave (the
timed tests wait on emulated links most of the time). The command runs in a CPU cgroup of a quarter of the default weight
(cgroup v1 ``cpu.shares`` 256 of 1024, v2 ``cpu.weight`` 25 of 100) named like the emulator's (``autosync-<pid>-tests``, so that
``autosync cluster sweep`` removes it if this process is killed); the cgroup is removed when the command ends.
The uneven emulated clusters the command starts put their ranks in CPU cgroups of their own, outside this one: they
get the same quarter weight (``$AUTOSYNC_RANK_WEIGHT``, :mod:`autosync.executor.emulate`).
Nice alone does not do it: the kernel's autogroups weigh every session alike, and ranks and command lines start
sessions of their own. Not idle (v1 ``cpu.idle``) either: starved whole while a timed test computes, a trial of the
rest missed its 12 s time limit starting its ranks. Where no CPU cgroup is writable (no root), the command runs at
nice 19.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def low_group() -> Path | None:
    """A new CPU cgroup of a quarter of the default weight, or None where none can be made."""
    for root, knob, value in ((Path("/sys/fs/cgroup/cpu"), "cpu.shares", "256"), (Path("/sys/fs/cgroup"), "cpu.weight", "25")):
        if not (root / knob).exists() or not os.access(root, os.W_OK):
            continue
        group = root / f"autosync-{os.getpid()}-tests"
        try:
            group.mkdir()
            (group / knob).write_text(value)
            return group
        except OSError:
            remove(group)
    return None


def remove(group: Path) -> None:
    """Remove the cgroup once the processes that outlived the command (if any) are gone (10 s at most)."""
    deadline = time.monotonic() + 10
    while group.exists():
        try:
            group.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                print(f"beside.py: could not remove {group} (processes left in it)", file=sys.stderr)
                return
            time.sleep(0.2)


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    group = low_group()

    def enter():
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        else:
            os.nice(19)

    # the CPU cgroups of uneven emulated clusters the command makes: at this group's weight, not above the timed tests
    env = {**os.environ, "AUTOSYNC_RANK_WEIGHT": "0.25"}
    proc = subprocess.Popen(sys.argv[1:], preexec_fn=enter, env=env)
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:        # make's process group got it too: wait for the command to end
                proc.send_signal(signal.SIGINT)
    finally:
        if group is not None:
            remove(group)


if __name__ == "__main__":
    sys.exit(main())
