"""LightGBM cost models: predict the speedup of a strategy over the DDP default.

Two kinds, one interface (``fit``, ``predict``, ``save``, ``load``):
- ``ranker``: LGBMRanker, lambdarank objective, grouped by context; scores order
  strategies within a context (higher = faster), they are not speedups;
- ``regressor``: LGBMRegressor on ``log(speedup)``; ``exp(score)`` is a predicted speedup.

Saved as LightGBM's text format (``model.txt``) beside a JSON card (``card.json``: kind,
feature list, dataset hash, hyper-parameters, held-out metrics). Never pickled. Loading
checks the model file's SHA-256 against the card before LightGBM sees it (LightGBM aborts
the whole process on some truncated files), that every feature of the card is one this code
computes, and the card's list against the model file's own: a mismatch is an error, never a
silent wrong score. The model keeps its card's column order; :meth:`CostModel.score` builds
its input by name.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import lightgbm as lgb
import numpy as np

from autosync.errors import UserError
from autosync.models.features import FEATURES, feature_matrix

CARD_VERSION = 1
PARAMS = {
    "ranker": dict(objective="lambdarank", n_estimators=300, learning_rate=0.05, num_leaves=15, min_child_samples=5,
                   subsample=0.8, subsample_freq=1, colsample_bytree=0.8, verbose=-1, n_jobs=1,
                   label_gain=list(range(31))),
    "regressor": dict(objective="regression", n_estimators=400, learning_rate=0.05, num_leaves=15,
                      min_child_samples=5, subsample=0.8, subsample_freq=1, colsample_bytree=0.8, verbose=-1,
                      n_jobs=1),
}


class ModelError(UserError):
    """A cost-model file that is missing, corrupt, or made for other features."""


@dataclass
class CostModel:
    kind: str
    features: list[str] = field(default_factory=lambda: list(FEATURES))
    booster: lgb.Booster | None = None
    card: dict = field(default_factory=dict)

    def fit(self, X: np.ndarray, log_speedup: np.ndarray, relevance: np.ndarray, groups: list[int],
            seed: int = 0) -> "CostModel":
        params = dict(PARAMS[self.kind], random_state=seed)
        if self.kind == "ranker":
            model = lgb.LGBMRanker(**params)
            model.fit(X, relevance, group=groups, feature_name=self.features)
        else:
            model = lgb.LGBMRegressor(**params)
            model.fit(X, log_speedup, feature_name=self.features)
        self.booster = model.booster_
        self.card = {"card_version": CARD_VERSION, "kind": self.kind, "features": self.features,
                     "hyper_parameters": {k: v for k, v in params.items() if k != "label_gain"}}
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Scores for a batch of candidates (rows of X in ``features`` order); higher = faster."""
        if self.booster is None:
            raise ModelError("the cost model is not trained")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.features):
            raise ModelError(f"expected {len(self.features)} features per candidate, got shape {X.shape}")
        return self.booster.predict(X, num_threads=1)

    def save(self, directory: str | Path, **card_extra) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model_text = self.booster.model_to_string()
        card = {**self.card, **card_extra, "model_sha256": hashlib.sha256(model_text.encode()).hexdigest()}
        for name, text in (("model.txt", model_text), ("card.json", json.dumps(card, indent=1))):
            tmp = directory / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, directory / name)
        self.card = card

    @classmethod
    def load(cls, directory: str | Path) -> "CostModel":
        directory = Path(directory)
        card_path, model_path = directory / "card.json", directory / "model.txt"
        try:
            card = json.loads(card_path.read_text())
        except OSError as e:
            raise ModelError(f"{card_path}: cannot read model card ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ModelError(f"{card_path}: corrupt model card (line {e.lineno}: {e.msg})") from None
        if card.get("card_version") != CARD_VERSION or card.get("kind") not in PARAMS:
            raise ModelError(f"{card_path}: not a cost-model card of version {CARD_VERSION}")
        features = card.get("features")
        if not isinstance(features, list) or set(features) - set(FEATURES):
            raise ModelError(f"{card_path}: the model was trained on other features than this autosync computes "
                             "(retrain it with `autosync train`)")
        try:
            text = model_path.read_bytes()
        except OSError as e:
            raise ModelError(f"{model_path}: cannot read model ({e.strerror})") from None
        if hashlib.sha256(text).hexdigest() != card.get("model_sha256"):
            raise ModelError(f"{model_path}: corrupt LightGBM model (its SHA-256 does not match {card_path.name})")
        try:
            booster = lgb.Booster(model_str=text.decode())
        except (lgb.basic.LightGBMError, UnicodeDecodeError) as e:
            raise ModelError(f"{model_path}: corrupt LightGBM model ({str(e).splitlines()[0]})") from None
        if booster.feature_name() != features:
            raise ModelError(f"{model_path}: its features do not match its card")
        return cls(card["kind"], list(features), booster, card)

    def score(self, feature_rows: list[dict[str, float]]) -> np.ndarray:
        """Scores of candidates given as feature dicts (from ``featurize``), in this model's own column order."""
        return self.predict(feature_matrix(feature_rows, self.features))
