"""Datasets of measured trials: the store (:mod:`autosync.datasets.store`) and the shipped dataset's folder.

Wherever a dataset folder is taken (the CLI's ``--data``, the Python API's ``data=``, :class:`DatasetStore`),
``"shipped"`` (:data:`SHIPPED`) names the dataset shipped with autosync, :data:`SHIPPED_DATA`.
"""
from pathlib import Path

SHIPPED = "shipped"
SHIPPED_DATA = Path(__file__).parent / "data"   # the dataset the pretrained models were trained on


def resolve(path: str | Path) -> Path:
    """A dataset folder: ``"shipped"`` is :data:`SHIPPED_DATA`, anything else the path it names."""
    return SHIPPED_DATA if str(path) == SHIPPED else Path(path)
