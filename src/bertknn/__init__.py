"""bertknn: BERT-kNN, a masked language model that answers cloze questions with evidence from a text collection."""

from bertknn.combine import Neighbour, Prediction, TokenScore
from bertknn.datastore import Datastore, DatastoreError
from bertknn.default_model import DEFAULT_MODEL
from bertknn.encoder import Encoder, ModelError, QuestionError
from bertknn.pipeline import BertKNN
from bertknn.settings import PAPER, Settings
from bertknn.text import CorpusError

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
