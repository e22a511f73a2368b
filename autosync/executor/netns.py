"""What the emulator (:mod:`autosync.executor.emulate`) and its fidelity probe (:mod:`autosync.executor.fidelity`)
share: the name prefix of every namespace and cgroup autosync makes, its error, and how a command is run."""
from __future__ import annotations

import subprocess

PREFIX = "autosync-"


class EmulationError(RuntimeError):
    """The emulated network could not be built."""


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd``; with ``check``, a failure is an EmulationError naming the command and its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc
