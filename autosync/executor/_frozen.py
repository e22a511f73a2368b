"""Imported last by the rank pools' forkserver (:data:`autosync.executor.launch.PRELOAD`): moves every object the
server holds by then (torch's and its imports', about a million) into the collector's permanent generation, where
the ranks forked from it never traverse them.

Without it each rank's first full collection walks all of them and writes to their headers, so the kernel copies
the pages the ranks share with the server, copy-on-write: CPU time in every rank of every trial, and memory. This
is what CPython's documentation of :func:`gc.freeze` recommends for a server that forks without exec."""
import gc

gc.freeze()
