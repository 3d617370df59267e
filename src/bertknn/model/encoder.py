"""Encoder stage: a Hugging Face masked LM, read at the [MASK] position (SPEC §1 and §3).

`Encoder.embed` gives datastore keys: the state after block L at each masked target, running the blocks only up to
L and skipping the head. `Encoder.query` gives, in one forward pass of a question, both the LM's distribution at the
mask and the same layer-L state. Both forward functions run in PyTorch (backend "torch") or, exported once, in ONNX
Runtime (backend "onnx", faster on CPUs: onnx_backend.py).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import __version__ as transformers_version

from bertknn.model.default_model import DEFAULT_MODEL, load_default_model
from bertknn.model.onnx_backend import OnnxRunner
from bertknn.model.runtime import Runtime
from bertknn.text import MASK, Sentence, masked, question_error

BLOCK_PATHS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")
# Attention kernels on a GPU: not cuDNN's, which plans anew for each batch shape it meets and bertknn's length-sorted
# batches vary in shape (bench/README.md, "GPU build and questions")
GPU_ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
TOKEN_BUDGET = 1024  # padded tokens per model batch: faster than 8,192 for keys, 4,096 for questions (bench/README.md)
GPU_TOKEN_BUDGET = 32_768  # padded tokens per batch of keys on a GPU, which small batches leave idle (bench/README.md)
# The sentence weights' texts, single words to whole sentences, in smaller batches: less padding (bench/README.md)
SENTENCE_BUDGET = 256


def cache_dir() -> Path:
    """Where bertknn caches what it builds itself (datastores, ONNX graphs): $BERTKNN_CACHE, else
    $XDG_CACHE_HOME/bertknn or ~/.cache/bertknn."""
    if os.environ.get("BERTKNN_CACHE"):
        return Path(os.environ["BERTKNN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bertknn"


class ModelError(ValueError):
    """A model that cannot be used: not found, no masked-LM head, or a layer it does not have."""


class QuestionError(ValueError):
    """A question that is not a cloze question with exactly one [MASK], or not valid Unicode; `index`: which one of
    a batch (its cause, when set, is the error of that question alone)."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        transformers.logging.enable_progress_bar()


def load_masked_lm(name: str):
    """Load a masked LM and its fast tokenizer by hub name or local directory; refuse one without its MLM head."""
    if name == DEFAULT_MODEL:
        return load_default_model()
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(name)
            model, info = AutoModelForMaskedLM.from_pretrained(name, output_loading_info=True)
    except (OSError, ValueError) as err:
        raise ModelError(
            f"cannot load model {name!r}: it is neither a local directory with a Hugging Face masked LM nor a model "
            f"reachable on the hub ({str(err).splitlines()[0]}). Offline, use the default model {DEFAULT_MODEL!r}."
        ) from None
    prefix = f"{model.base_model_prefix}."
    head_missing = sorted(k for k in info["missing_keys"] if not k.startswith(prefix))
    if head_missing:
        raise ModelError(
            f"model {name!r} has no trained masked-LM head (missing: {', '.join(head_missing[:4])}...): transformers "
            "would fill it with random weights and every prediction would be noise. Use a checkpoint saved with its "
            "MLM head (e.g. bert-base-uncased), or train one (`bertknn train-head` does this for the default model)."
        )
    if not tokenizer.is_fast or tokenizer.mask_token is None:
        raise ModelError(f"model {name!r} needs a fast tokenizer with a mask token")
    return model.eval(), tokenizer


def _find_blocks(base: nn.Module) -> str | None:
    for path in BLOCK_PATHS:
        with contextlib.suppress(AttributeError):
            if isinstance(base.get_submodule(path), nn.ModuleList):
                return path
    return None


def _truncated(base: nn.Module, path: str, n_blocks: int) -> nn.Module:
    """A view of `base` that runs only its first `n_blocks` blocks; it shares every parameter with `base`."""
    parts = path.split(".")
    root = copy.copy(base)
    root._modules = dict(base._modules)
    parent = root
    for part in parts[:-1]:
        child = copy.copy(parent._modules[part])
        child._modules = dict(child._modules)
        parent._modules[part] = child
        parent = child
    parent._modules[parts[-1]] = nn.ModuleList(list(parent._modules[parts[-1]])[:n_blocks])
    return root


def length_batches(lengths: Sequence[int], token_budget: int) -> Iterator[list[int]]:
    """Indices of `lengths` sorted by length, in batches of at most `token_budget` padded tokens (count x longest;
    a longer item alone): little padding, and batches as large as the budget allows."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * lengths[order[stop]] <= token_budget:
            stop += 1
        yield order[start:stop]
        start = stop


def mask_groups(n_targets: int, pack: int) -> list[list[int]]:
    """Targets 0..n-1 of a sentence (in position order) in groups of at most `pack` masked in one pass.

    Group g takes every G-th target from g, with G >= 2 whenever there are two targets, so two targets of a group
    always have another target between them: masked tokens are never adjacent.
    """
    if pack < 1:
        raise ValueError(f"pack must be >= 1, got {pack}")
    if pack == 1:
        return [[j] for j in range(n_targets)]
    n_groups = max(-(-n_targets // pack), min(n_targets, 2))
    return [list(range(g, n_targets, n_groups)) for g in range(n_groups)]


class Encoder:
    """A masked LM with its tokenizer, read at the mask after block `layer` (default: the second-to-last).

    `runtime` (a `Runtime`, or a `--backend` name): with the onnx engine the same forward functions run in ONNX
    Runtime (exported to cache_dir()/onnx on first use); with `int8_questions` questions run quantised to int8
    (faster, approximate LM distribution and query state). With the torch engine the model runs on the runtime's
    device and dtype (moved there when the Encoder is made); outputs always come back as float32 numpy arrays.
    """

    def __init__(
        self, model: nn.Module, tokenizer, name: str, layer: int | None = None, runtime: Runtime | str = "torch"
    ) -> None:
        self.runtime = Runtime.of(runtime)
        n_layers = model.config.num_hidden_layers
        self.layer = n_layers - 1 if layer is None else layer
        if not 1 <= self.layer <= n_layers:
            raise ModelError(f"layer {self.layer} does not exist: model {name!r} has blocks 1..{n_layers}")
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.base = model.base_model
        self.head = getattr(model, "cls", None) or getattr(model, "lm_head", None)
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id or 0
        self.trunk = self._checked_trunk()  # checked in float32 on CPU, before the model moves
        self._runners: dict[str, OnnxRunner] = {}
        if (self.runtime.device, self.runtime.dtype) != ("cpu", "float32"):
            weights = next(model.parameters())
            if (weights.device.type, weights.dtype) == ("cpu", torch.float32):  # not moved yet (`at_layer` shares)
                _ = self.weights_hash  # of the weights as given: the same model's datastore on any device or dtype
            for module in (self.model, self.trunk):
                if module is not None:
                    module.to(device=self.runtime.torch_device, dtype=self.runtime.torch_dtype)

    @torch.inference_mode()
    def _checked_trunk(self) -> nn.Module | None:
        """The blocks 1..L of the model, kept only if they reproduce the full model's layer-L states here."""
        path = _find_blocks(self.base)
        if path is None:
            return None
        trunk = _truncated(self.base, path, self.layer)
        ids = torch.tensor([[self.tokenizer.cls_token_id or 0, self.mask_id, self.tokenizer.sep_token_id or 0]])
        ids = ids.to(next(self.base.parameters()).device)  # a model shared with another Encoder may have moved
        full = self.base(input_ids=ids, output_hidden_states=True).hidden_states[self.layer]
        return trunk if torch.allclose(trunk(input_ids=ids).last_hidden_state, full, atol=1e-5) else None

    @classmethod
    def load(cls, name: str = DEFAULT_MODEL, layer: int | None = None, runtime: Runtime | str = "torch") -> Encoder:
        """Load a masked LM by hub name or local directory (or the offline default) and read block `layer`."""
        model, tokenizer = load_masked_lm(name)
        return cls(model, tokenizer, name, layer, runtime)

    def at_layer(self, layer: int) -> Encoder:
        """The same model (weights shared) read at another block."""
        if layer == self.layer:
            return self
        other = Encoder(self.model, self.tokenizer, self.name, layer, self.runtime)
        other.weights_hash = self.weights_hash  # the weights as given (the shared model may have moved since)
        return other

    @property
    def cache_tag(self) -> str:
        """This model and layer in the names of what is cached for them (datastores, ONNX graphs)."""
        return f"{self.weights_hash[:12]}-L{self.layer}"

    @property
    def dim(self) -> int:
        """Width of a key (the model's hidden size)."""
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        """Size of the output distribution."""
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_length(self) -> int:
        """The most tokens one input may have: the tokenizer's limit, or the model's position embeddings' if fewer."""
        limit = self.tokenizer.model_max_length
        return min(limit, getattr(self.model.config, "max_position_embeddings", limit))

    @cached_property
    def weights_hash(self) -> str:
        """sha256 over every weight (name, shape and bytes): identifies the exact model a datastore was built with."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()

    def question_ids(self, text: str) -> tuple[list[int], int]:
        """Token ids of a cloze question (cut to `max_length`) and the position of its single mask (QuestionError
        otherwise)."""
        error = question_error(text)
        if error:
            raise QuestionError(error)
        text = text.replace(MASK, self.tokenizer.mask_token)
        ids = self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"]
        if ids.count(self.mask_id) != 1:
            raise QuestionError(
                f"the question is too long: its {MASK} falls beyond the model's input length"
                if ids.count(self.mask_id) == 0
                else f"the question holds the model's mask token {self.tokenizer.mask_token!r} besides its {MASK}"
            )
        return ids, ids.index(self.mask_id)

    def _pad(self, seqs: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """`seqs` right-padded into one batch: token ids and the attention mask, [n, longest] each."""
        lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
        attention = np.arange(lengths.max()) < lengths[:, None]
        ids = np.full(attention.shape, self.pad_id, np.int64)
        ids[attention] = np.concatenate(seqs)  # row by row, in order
        return torch.from_numpy(ids), torch.from_numpy(attention.astype(np.int64))

    def query(self, texts: list[str], token_budget: int = TOKEN_BUDGET) -> tuple[np.ndarray, np.ndarray]:
        """LM probabilities at the mask [n, V] and layer-L states [n, d] of questions, one forward pass each."""
        return self.query_ids([self.question_ids(t) for t in texts], token_budget)

    @torch.inference_mode()
    def query_ids(
        self, encoded: Sequence[tuple[list[int], int]], token_budget: int = TOKEN_BUDGET
    ) -> tuple[np.ndarray, np.ndarray]:
        """`query` of questions already encoded by `question_ids` ((token ids, mask position) each).

        The questions run sorted by length in batches of at most `token_budget` padded tokens; outputs come back in
        the order given.
        """
        probs = np.empty((len(encoded), self.vocab_size), np.float32)
        states = np.empty((len(encoded), self.dim), np.float32)
        int8, outputs = self.runtime.int8_questions, ("logits", "states")
        for batch in length_batches([len(ids) for ids, _ in encoded], token_budget):
            ids, attention = self._pad([np.asarray(encoded[i][0]) for i in batch])
            rows, cols = torch.arange(len(batch)), torch.tensor([encoded[i][1] for i in batch])
            logits, states[batch] = self._run(self._mask_outputs, outputs, ids, attention, rows, cols, int8=int8)
            probs[batch] = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
        return probs, states

    @torch.inference_mode()
    def sentence_vectors(
        self, texts: Sequence[str], token_budget: int = SENTENCE_BUDGET, threads: int = 0
    ) -> np.ndarray:
        """Unit-length vectors of whole texts [n, d]: the model's last hidden states averaged over each text's tokens
        (mean pooling, as sentence-transformers pools), for comparing a question with an evidence sentence. For the
        default model (all-MiniLM-L6-v2's encoder) these are that sentence model's own embeddings. `threads`: ONNX
        Runtime's threads for these passes (0: the runtime's; each count has a session of its own)."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        out = np.empty((len(texts), self.dim), np.float32)
        for batch in length_batches([len(ids) for ids in encoded], token_budget):
            ids, attention = self._pad([np.asarray(encoded[i]) for i in batch])
            rows, cols = torch.arange(len(batch)), torch.zeros(len(batch), dtype=torch.long)
            (out[batch],) = self._run(self._mean_states, ("vectors",), ids, attention, rows, cols, threads=threads)
        return out

    @property
    def key_budget(self) -> int:
        """Padded tokens per batch of keys by default: few on a CPU, where small batches run fastest, many on a GPU."""
        return GPU_TOKEN_BUDGET if self.runtime.torch_device.type == "cuda" else TOKEN_BUDGET

    @torch.inference_mode()
    def embed(
        self, sentences: list[Sentence], token_budget: int | None = None, pack: int = 1, int8_keys: bool = False
    ) -> np.ndarray:
        """Layer-L keys of every target of `sentences` (sentence order, then target order) as float32 [n, d].

        A context is the token ids of the target's window (its whole sentence unless that is long: Sentence) with the
        target's tokens replaced by one mask id (`text.masked`), as a question asks for a word; a word of one token
        is read with every other position kept. With `pack` > 1, up to `pack` non-adjacent targets of a window are
        masked together and read from one pass (as in BERT's pre-training, which masks 15% of tokens): fewer passes,
        keys close to but not equal to single-mask keys. With `int8_keys`, the passes run in ONNX Runtime quantised
        to int8 (whatever the runtime): faster, keys close to float32's. Passes are sorted by length and batched
        under `token_budget` padded tokens (None: `key_budget`).
        """
        if int8_keys and (self.runtime.device, self.runtime.dtype) != ("cpu", "float32"):
            raise ValueError("int8 keys are computed by ONNX Runtime on CPU: drop --int8-keys, or use --device cpu")
        passes = list(self._passes(sentences, pack))
        keys = np.empty((sum(len(s.positions) for s in sentences), self.dim), dtype=np.float32)
        pending = None  # the batch the device is still computing: its keys are read after the next is launched
        for order in length_batches([len(ids) for ids, _, _ in passes], token_budget or self.key_budget):
            batch = [passes[j] for j in order]
            ids, attention = self._pad([window for window, _, _ in batch])
            rows = torch.from_numpy(np.repeat(np.arange(len(batch)), [len(p) for _, p, _ in batch]))
            cols = torch.from_numpy(np.concatenate([p for _, p, _ in batch]).astype(np.int64))
            (states,) = self._launch(self._key_states, ("states",), ids, attention, rows, cols, int8=int8_keys)
            if pending:
                keys[pending[0]] = pending[1]()
            pending = np.concatenate([k for _, _, k in batch]), states
        if pending:
            keys[pending[0]] = pending[1]()
        return keys

    def _passes(self, sentences: list[Sentence], pack: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`embed`'s model passes: the window's token ids with a group of targets masked, the masks' positions there
        and the targets' rows in the keys."""
        first = 0
        for s in sentences:
            for ids, targets in s.window_targets():
                for group in mask_groups(len(targets), pack):
                    chosen = targets[group]
                    yield (*masked(ids, s.positions[chosen], s.lengths[chosen], self.mask_id), first + chosen)
            first += len(s.positions)

    def _run(
        self, forward, outputs: tuple[str, ...], *inputs: torch.Tensor, int8: bool = False, threads: int = 0
    ) -> list[np.ndarray]:
        """`forward(ids, attention, rows, cols)` on this encoder's runtime (ONNX Runtime int8 if `int8`; on `threads`
        if not 0), as float32."""
        return [result() for result in self._launch(forward, outputs, *inputs, int8=int8, threads=threads)]

    def _launch(
        self, forward, outputs: tuple[str, ...], *inputs: torch.Tensor, int8: bool = False, threads: int = 0
    ) -> list[Callable[[], np.ndarray]]:
        """Start `forward` (as `_run`) and return a function per output that waits for it. On a GPU the inputs go
        from pinned memory and the outputs come back into pinned memory, both without blocking, so the CPU prepares
        the next batch while the GPU computes this one; elsewhere the work is done before this returns."""
        if not (self.runtime.onnx or int8):
            device = self.runtime.torch_device
            if device.type == "cpu":
                done = [t.float().numpy() for t in forward(*inputs)]
                return [lambda a=a: a for a in done]
            inputs = tuple(t.pin_memory().to(device, non_blocking=True) for t in inputs)
            hosts = []
            with sdpa_kernel(list(GPU_ATTENTION)):
                results = forward(*inputs)
            for t in results:
                host = torch.empty(t.shape, dtype=torch.float32, pin_memory=True)
                host.copy_(t.float(), non_blocking=True)
                hosts.append(host)
            ready = torch.cuda.Event()
            ready.record()
            return [lambda h=h: (ready.synchronize(), h.numpy())[1] for h in hosts]
        name = forward.__name__.strip("_")
        key = f"{name}{'-int8' if int8 else ''}{f'-t{threads}' if threads else ''}"
        if key not in self._runners:
            versions = f"torch{torch.__version__}-transformers{transformers_version}"
            stem = f"{self.cache_tag}-{name}-{versions}"
            path = cache_dir() / "onnx" / f"{stem}.onnx"
            self._runners[key] = (
                OnnxRunner(forward, self.model, outputs, path.with_name(f"{stem}-int8.onnx"), path, threads)
                if int8
                else OnnxRunner(forward, self.model, outputs, path, threads=threads)
            )
        return [lambda a=a: a for a in self._runners[key](*inputs)]

    def graphs(self) -> dict[str, OnnxRunner]:
        """The ONNX Runtime graphs this encoder has opened, by forward function ("-int8": quantised)."""
        return dict(self._runners)

    def _mask_outputs(self, ids, attention, rows, cols) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's logits and the layer-L states at the given (row, column) positions, from one full pass."""
        if self.head is not None:  # head on the mask positions only
            out = self.base(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            logits = self.head(out.last_hidden_state[rows, cols])
        else:
            out = self.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            logits = out.logits[rows, cols]
        return logits.float(), out.hidden_states[self.layer][rows, cols].float()

    def _mean_states(self, ids, attention, rows, cols) -> tuple[torch.Tensor]:
        """The last hidden states of rows `rows` averaged over their tokens and scaled to length 1 (`cols` unused:
        every forward function takes the same inputs)."""
        states = self.base(input_ids=ids, attention_mask=attention).last_hidden_state[rows].float()
        weights = attention[rows].unsqueeze(-1).to(states.dtype)
        mean = (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return (torch.nn.functional.normalize(mean, dim=-1),)

    def _key_states(self, ids, attention, rows, cols) -> tuple[torch.Tensor]:
        """Layer-L states at the given positions, running only blocks 1..L when the model allows it."""
        if self.trunk is not None:
            states = self.trunk(input_ids=ids, attention_mask=attention).last_hidden_state
        else:
            out = self.base(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            states = out.hidden_states[self.layer]
        return (states[rows, cols].float(),)
