"""What the emulator (:mod:`autosync.executor.emulate`), its fidelity probe (:mod:`autosync.executor.fidelity`) and
its delay lines (:mod:`autosync.executor.delayline`) share: the name prefix of every namespace and cgroup autosync makes, its error, and how a command is run."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

PREFIX = "autosync-"


class EmulationError(RuntimeError):
    """The emulated network could not be built."""


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd``; with ``check``, a failure is an EmulationError naming the command and its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def remove_cgroup(path: Path, attempts: int = 20) -> bool:
    """rmdir a cgroup, first moving what is still in it (a dying rank) to its parent; False if it stayed."""
    for _ in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            try:
                for pid in (path / "cgroup.procs").read_text().split():
                    try:
                        (path.parent / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
            except OSError:
                pass
            time.sleep(0.05)
    return False
