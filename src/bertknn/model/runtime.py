"""Where and how the model runs: one record (engine, int8 questions, threads, device, dtype) decided in one place.

The command line's `--backend` names map onto it: "torch" (PyTorch eager), "onnx" (ONNX Runtime: the same numbers,
faster on CPU), "onnx-int8" (ONNX Runtime with questions quantised to int8: faster still, approximate) and "auto"
(PyTorch on a GPU, ONNX Runtime on CPU). `--device` picks the processor (auto: a CUDA GPU when PyTorch sees one),
`--dtype` the precision the model runs in (float32, exact, the default; bfloat16 or float16 on a GPU, bfloat16 also
on CPU). Int8 *keys* are a property of a datastore, chosen when it is built (`int8_keys`), not of the runtime.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # PyTorch is imported where it is used: `bertknn --help` should not wait for it
    import torch

BACKENDS = ("auto", "torch", "onnx", "onnx-int8")  # the `--backend` names
CLI_BACKEND = "auto"  # the command line's default; the library's is PyTorch on CPU (no export step)
ENGINES = ("torch", "onnx")
DTYPES = ("float32", "bfloat16", "float16")  # as PyTorch names them
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"} | {name: name for name in DTYPES}
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def cuda_devices() -> int:
    """How many CUDA GPUs PyTorch sees (0 without a GPU or without a CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class Runtime:
    """How the model runs. engine: "torch" or "onnx"; int8_questions: questions run quantised to int8 (ONNX Runtime);
    threads: CPU threads for the model (0: all cores); device: "cpu", "cuda" or "cuda:N" ("auto" is resolved when the
    record is made: a GPU when PyTorch sees one, for the torch engine); dtype: "float32", "bfloat16" or "float16" (the
    model's weights and activations; keys are stored as float16 whatever it is). Made with a bad value or one this
    machine cannot run, it raises ValueError saying what to use instead. remote: made for other machines (the
    workers of a Ray cluster, whose driver may have no GPU): "auto" and the device are left to `here()` on each."""

    engine: str = "torch"
    int8_questions: bool = False
    threads: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    remote: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if not isinstance(self.device, str) or not DEVICE.fullmatch(self.device):
            raise ValueError(f"unknown device {self.device!r}: use auto, cpu, cuda or cuda:N")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPE_NAMES)}")
        object.__setattr__(self, "dtype", DTYPE_NAMES[self.dtype])
        if self.int8_questions and self.engine != "onnx":
            raise ValueError("int8 questions run in ONNX Runtime: use the onnx engine (--backend onnx-int8)")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"threads must be a whole number >= 0 (0: all cores), not {self.threads!r}")
        if self.remote:
            return
        if self.device == "auto":
            object.__setattr__(self, "device", "cuda" if self.engine == "torch" and cuda_devices() else "cpu")
        self._check_machine()

    def here(self) -> Runtime:
        """This runtime on the machine that runs the model: "auto" resolved and the device checked there."""
        return dataclasses.replace(self, remote=False) if self.remote else self

    def _check_machine(self) -> None:
        """Refuse what this machine or engine cannot run, naming the way out."""
        if self.device.startswith("cuda"):
            index = int(self.device.partition(":")[2] or 0)
            if index >= cuda_devices():
                import torch

                raise ValueError(
                    f"device {self.device!r}: PyTorch sees {cuda_devices()} CUDA GPU(s) here (torch "
                    f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu or auto"
                )
            if self.engine == "onnx":
                raise ValueError("the onnx engine runs on CPU: on a GPU use --backend torch (or auto)")
        if self.engine == "onnx" and self.dtype != "float32":
            raise ValueError(f"the onnx engine runs float32 graphs: --dtype {self.dtype} needs --backend torch")
        if self.dtype == "float16" and self.device == "cpu":
            raise ValueError("float16 runs on a GPU only: on CPU use --dtype bfloat16 (or float32, exact)")

    @classmethod
    def of(
        cls, backend: str | Runtime, threads: int = 0, device: str = "cpu", dtype: str = "float32", remote: bool = False
    ) -> Runtime:
        """The runtime a `--backend` name stands for on `device` in `dtype` (a Runtime is returned as it is).
        "auto" is PyTorch on a GPU, else ONNX Runtime (float32) or PyTorch (other dtypes); `remote`: see Runtime."""
        if isinstance(backend, Runtime):
            return backend
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
        if backend == "auto":
            on_gpu = device.startswith("cuda") or (device == "auto" and (remote or cuda_devices() > 0))
            backend = "torch" if on_gpu or DTYPE_NAMES.get(dtype, dtype) != "float32" else "onnx"
        return cls("torch" if backend == "torch" else "onnx", backend == "onnx-int8", threads, device, dtype, remote)

    @property
    def torch_device(self) -> torch.device:
        """The device as PyTorch names it."""
        import torch

        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as PyTorch names it."""
        import torch

        return getattr(torch, self.dtype)

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
        import torch
        from threadpoolctl import threadpool_limits

        from bertknn.model import onnx_backend

        n = self.threads or os.cpu_count() or 1
        torch.set_num_threads(1 if self.onnx else n)
        onnx_backend.set_threads(n if self.onnx else None)
        threadpool_limits(1, user_api="blas")
