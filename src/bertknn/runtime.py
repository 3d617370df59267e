"""Where and how the model runs: one record (engine, int8 questions, threads, device, dtype) decided in one place.

The command line's `--backend` names map onto it: "torch" (PyTorch eager), "onnx" (ONNX Runtime: the same numbers,
faster on CPU) and "onnx-int8" (ONNX Runtime with questions quantised to int8: faster still, approximate). Int8
*keys* are a property of a datastore, chosen when it is built (`int8_keys`), not of the runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bertknn import onnx_backend

BACKENDS = ("torch", "onnx", "onnx-int8")  # the `--backend` names
CLI_BACKEND = "onnx"  # the command line's default: faster on CPU; the library's is PyTorch (no export step)
ENGINES = ("torch", "onnx")
DEVICES = ("cpu",)  # the devices that run today
DTYPES = ("float32",)


@dataclass(frozen=True)
class Runtime:
    """How the model runs. engine: "torch" or "onnx"; int8_questions: questions run quantised to int8 (ONNX Runtime);
    threads: CPU threads for the model (0: all cores); device and dtype: "cpu" and "float32" (the only ones so far).
    Made with a bad value, it raises ValueError naming the choices."""

    engine: str = "torch"
    int8_questions: bool = False
    threads: int = 0
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name, value, known in (("engine", self.engine, ENGINES), ("device", self.device, DEVICES)):
            if value not in known:
                raise ValueError(f"unknown {name} {value!r}: use one of {', '.join(known)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported: use one of {', '.join(DTYPES)}")
        if self.int8_questions and self.engine != "onnx":
            raise ValueError("int8 questions run in ONNX Runtime: use the onnx engine (--backend onnx-int8)")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"threads must be a whole number >= 0 (0: all cores), not {self.threads!r}")

    @classmethod
    def of(cls, backend: str | Runtime, threads: int = 0) -> Runtime:
        """The runtime a `--backend` name stands for (a Runtime is returned as it is)."""
        if isinstance(backend, Runtime):
            return backend
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
        return cls("torch" if backend == "torch" else "onnx", backend == "onnx-int8", threads)

    @property
    def backend(self) -> str:
        """The `--backend` name of this runtime."""
        return "onnx-int8" if self.int8_questions else self.engine

    @property
    def onnx(self) -> bool:
        """True when the model runs in ONNX Runtime."""
        return self.engine == "onnx"

    def apply(self) -> None:
        """Give the model its threads and numpy's BLAS one: two busy pools on few cores stall each other.

        With ONNX Runtime, it gets the threads and PyTorch (left with small array work: softmax, top-k) one, so that
        its OpenMP pool does not stall ONNX Runtime's (the time saved per question: bench/README.md).
        """
        from threadpoolctl import threadpool_limits

        n = self.threads or os.cpu_count() or 1
        torch.set_num_threads(1 if self.onnx else n)
        onnx_backend.set_threads(n if self.onnx else None)
        threadpool_limits(1, user_api="blas")
