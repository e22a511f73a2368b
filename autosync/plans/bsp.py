"""``bsp``: bulk synchronous parallel, DDP's own mode: every step, every bucket by its group's plan."""
from __future__ import annotations

from autosync.plans.base import SyncModeDef


class BulkSynchronous(SyncModeDef):
    name = "bsp"


MODE = BulkSynchronous()
