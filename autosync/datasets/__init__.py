"""Datasets of measured trials: the store (:mod:`autosync.datasets.store`) and the shipped dataset's folder."""
from pathlib import Path

SHIPPED_DATA = Path(__file__).parent / "data"   # the dataset the pretrained models were trained on
