"""How a user ends autosync: bad input (`UserError`: one clear line, exit 2) or a signal (`sigterm_as_interrupt`)."""
import signal


class UserError(Exception):
    """Bad input from the user (flag, file, workload, strategy): one clear line, exit status 2."""


def sigterm_as_interrupt(signum=None, frame=None):
    """SIGTERM handler: unwind like Ctrl-C (``KeyboardInterrupt``), so ``with`` blocks stop ranks and delete namespaces.

    Only the first SIGTERM counts: later ones are ignored for the rest of the process, which is on its way out.
    `pkill -f`, a `timeout` wrapper and a batch system's cancel often send several, and a second one raised inside
    the teardown would stop it halfway and leave namespaces behind (SIGKILL still ends it at once). Install with
    ``signal.signal(signal.SIGTERM, sigterm_as_interrupt)`` in the main thread.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt("SIGTERM")
