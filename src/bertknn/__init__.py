"""bertknn: BERT-kNN, a masked language model that answers cloze questions with evidence from a text collection.

The names below are imported when first used (PEP 562), so that `import bertknn.text` or a worker process that
splits sentences does not load PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertknn.model.default_model import DEFAULT_MODEL
    from bertknn.model.encoder import Encoder, ModelError, QuestionError
    from bertknn.query.pipeline import BertKNN
    from bertknn.query.prediction import Neighbour, Prediction, TokenScore
    from bertknn.query.settings import PAPER, Settings
    from bertknn.store.datastore import Datastore, DatastoreError
    from bertknn.text import CorpusError

_WHERE = {
    "Neighbour": "query.prediction",
    "Prediction": "query.prediction",
    "TokenScore": "query.prediction",
    "Datastore": "store.datastore",
    "DatastoreError": "store.datastore",
    "DEFAULT_MODEL": "model.default_model",
    "Encoder": "model.encoder",
    "ModelError": "model.encoder",
    "QuestionError": "model.encoder",
    "BertKNN": "query.pipeline",
    "PAPER": "query.settings",
    "Settings": "query.settings",
    "CorpusError": "text",
}
__all__ = [
    "DEFAULT_MODEL",
    "PAPER",
    "BertKNN",
    "CorpusError",
    "Datastore",
    "DatastoreError",
    "Encoder",
    "ModelError",
    "Neighbour",
    "Prediction",
    "QuestionError",
    "Settings",
    "TokenScore",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'bertknn' has no attribute {name!r}")
    return getattr(importlib.import_module(f"bertknn.{_WHERE[name]}"), name)
