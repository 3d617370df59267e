"""ONNX Runtime backend of the encoder: the same forward functions, exported once per model and layer.

Why: on a few CPU cores ONNX Runtime runs a bert-base-sized model faster than PyTorch eager with the same numbers
(speeds and differences measured by bench/query_path.py: bench/README.md).
Graphs are traced with padded inputs (so the attention mask stays in the graph) and cached as .onnx files. A graph
can also be run dynamically quantised to int8 (ONNX Runtime, per channel): datastore keys with `--int8-keys`,
questions with backend "onnx-int8" (fidelity and speed in bench/README.md).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

INPUTS = ("ids", "attention", "rows", "cols")
_threads: int | None = None  # intra-op threads of sessions opened from now on (None: PyTorch's count)
_MAKING = threading.Lock()  # held while a session is opened (and its graph exported)


def set_threads(n: int | None) -> None:
    """Threads of the ONNX Runtime sessions opened from now on; None: as many as PyTorch has."""
    global _threads
    _threads = n


class ExportError(ValueError):
    """A model that torch.onnx.export cannot trace: the torch backend still runs it."""


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


class _Traced(nn.Module):
    """A forward function of the encoder as a module (with the model's parameters) for torch.onnx.export."""

    def __init__(self, forward: Forward, model: nn.Module) -> None:
        super().__init__()
        self.model, self.run = model, forward

    def forward(self, ids, attention, rows, cols):
        return self.run(ids, attention, rows, cols)


def export(forward: Forward, model: nn.Module, outputs: tuple[str, ...], path: Path) -> None:
    """Trace `forward(ids, attention, rows, cols)` into an ONNX file at `path`, written whole and then renamed."""
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 5, 6, 2, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])  # padded: the mask must stay in the graph
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([1, 2, 1])
    axes = {"ids": {0: "batch", 1: "length"}, "attention": {0: "batch", 1: "length"}}
    axes.update({name: {0: "masks"} for name in ("rows", "cols", *outputs)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shape checks that hold for every input here
        torch.onnx.export(
            _Traced(forward, model).eval(),
            (ids, attention, rows, cols),
            str(tmp),
            input_names=list(INPUTS),
            output_names=list(outputs),
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    tmp.replace(path)


def quantize(source: Path, path: Path) -> None:
    """Write the int8 (dynamic, per channel) version of the ONNX graph at `source` to `path`, whole, then rename."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = path.with_suffix(".tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
    tmp.replace(path)


class OnnxRunner:
    """One exported forward function run by ONNX Runtime; exported on first use, re-exported if the file is bad.

    With `float_path`, the graph at `path` is the int8 quantisation of the float32 graph exported to `float_path`.
    `threads`: the session's threads (0: `set_threads`'s count, else PyTorch's).
    """

    def __init__(
        self,
        forward: Forward,
        model: nn.Module,
        outputs: tuple[str, ...],
        path: Path,
        float_path: Path | None = None,
        threads: int = 0,
    ) -> None:
        self.forward, self.model, self.outputs, self.path = forward, model, outputs, path
        self.float_path, self.threads = float_path, threads
        self._session = None
        self._inputs: set[str] | None = None  # the names of the session's inputs

    def _open(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads or _threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        # Idle workers wait asleep, not spinning: a spinning pool holds a core after each run, which on few cores
        # stalls the Python work between runs and another graph's run (a question's p50: bench/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])

    def session(self):
        """The ONNX Runtime session, exporting (and quantising) the graph first when no valid file is cached. One
        thread at a time: PyTorch's exporter keeps global state, and two sessions of one graph share its file."""
        if self._session is None:
            with _MAKING:
                if self._session is None and self.path.is_file():
                    with contextlib.suppress(Exception):  # a truncated or corrupt cache file: make it again
                        self._session = self._open()
                if self._session is None:
                    self._make()
                    self._session = self._open()
        return self._session

    def _make(self) -> None:
        """Export the graph, or quantise the cached float32 graph (exporting it first when it is missing or bad)."""
        if self.float_path and self.float_path.is_file():
            with contextlib.suppress(Exception):
                return quantize(self.float_path, self.path)
        try:
            export(self.forward, self.model, self.outputs, self.float_path or self.path)
        except Exception as err:  # the exporter raises many kinds; all mean this model cannot be traced
            raise ExportError(
                f"cannot export the model to ONNX ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                + ("use --backend torch without --int8-keys" if self.float_path else "use --backend torch")
            ) from err
        if self.float_path:
            quantize(self.float_path, self.path)

    def __call__(self, ids: torch.Tensor, attention: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
        """The forward function's outputs as float32 numpy arrays."""
        session = self.session()
        if self._inputs is None:  # the exporter drops an input the function does not read
            self._inputs = {i.name for i in session.get_inputs()}
        tensors = zip(INPUTS, (ids, attention, rows, cols))
        feed = {name: t.numpy().astype(np.int64) for name, t in tensors if name in self._inputs}
        return [np.asarray(out, np.float32) for out in session.run(list(self.outputs), feed)]
