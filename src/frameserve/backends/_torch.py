"""The torch backend: TorchScript (``model.pt``, ``torch.jit.load``) and ``torch.export``
programs (``model.pt2``, ``torch.export.load(...).module()``) on the CPU, under
``torch.inference_mode()``, with an explicit thread budget.

numpy arrays cross into torch and back through DLPack without copies: an input tensor is a
view of the caller's array and an output array a view of the tensor torch returned (so a model
that returns an input unchanged answers with a view of that input). A copy is made only where
torch's result is not contiguous, or to cast back from a reduced ``precision``. ``torch`` is
imported only when this backend is used.

Threads: torch's intra-op budget (``torch.set_num_threads``) is process-wide, and with the
OpenMP build it is held per calling thread; a session therefore sets its own budget on the
thread that runs each batch, so sessions with different budgets in one process each get theirs
batch by batch. Inter-op threads (``torch.set_num_interop_threads``) can be set only once per
process, before any parallel work: the first torch session sets 1 (execution is sequential), and
later ones report what is in force.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends._complete import RawTensor, complete_config, detect_signature
from frameserve.backends.base import ModelSignature
from frameserve.errors import BackendUnavailableError, InferenceError, ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.types import DataType, TensorSpec

__all__ = ["TorchSession"]

_PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
"""``precision`` -> the torch dtype the model and its floating inputs are cast to (fp32: none)."""

_DATATYPES = {
    "float32": DataType.FP32,
    "float16": DataType.FP16,
    "bfloat16": DataType.BF16,
    "float64": DataType.FP64,
    "int8": DataType.INT8,
    "int16": DataType.INT16,
    "int32": DataType.INT32,
    "int64": DataType.INT64,
    "uint8": DataType.UINT8,
    "uint16": DataType.UINT16,
    "uint32": DataType.UINT32,
    "uint64": DataType.UINT64,
    "bool": DataType.BOOL,
}
"""torch dtype name (``str(dtype)`` less ``torch.``) -> datatype; BYTES has no torch dtype."""

_interop_lock = threading.Lock()
_interop_done = False


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise BackendUnavailableError(
            "backend 'torch' needs the torch package: pip install 'frameserve[torch]'"
        ) from None
    return torch


def _set_interop_once(torch: Any) -> None:
    """Inter-op threads -> 1, once per process; torch raises once parallel work has started."""
    global _interop_done
    with _interop_lock:
        if not _interop_done:
            _interop_done = True
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:
                pass  # already set, or work already ran: keep what is in force (info reports it)


class TorchSession:
    """A torch session on the CPU (see :class:`frameserve.backends.Session`).

    Args:
        config: the model's config (completed here). A TorchScript file declares no tensor
            names or shapes, so its config must list every input and output (``name``,
            ``data_type``, ``dims``; ``max_batch_size`` left out means 0, ``dims`` full shapes);
            inputs go to ``forward`` by keyword when every name is one of its arguments, else in
            the config's order. An ExportedProgram's inputs are its ``forward`` arguments, with
            the example's dtypes and shapes (``-1`` where a dim is dynamic; a dynamic first dim
            on every tensor means the model batches, up to the program's bound); its outputs are
            the returned dict's keys, else ``output__0``, ``output__1`` ... The config may fix
            ``-1`` dims, and may rename tensors by position when it lists all of them.
        model_path: ``.pt2`` -> ``torch.export.load``; anything else -> ``torch.jit.load``.
        threads: intra-op threads (``torch.set_num_threads``, set on each run's thread).

    Outputs: the model returns one tensor, a tuple/list of tensors (config outputs in order),
    or a dict of name -> tensor. ``precision`` ``fp32`` runs the file as it is; ``bf16`` and
    ``fp16`` cast the model's parameters and its floating inputs, and cast floating outputs back
    to the configured datatype.

    Raises:
        BackendUnavailableError: torch is not installed (names the ``torch`` extra).
        ModelConfigError: an unsupported precision (lists the accepted ones), a file torch cannot
            load, a TorchScript config without inputs or outputs, a BYTES tensor, or a config
            that contradicts the model.
    """

    def __init__(self, config: ModelConfig, model_path: Path, *, threads: int, gpu: int | None = None) -> None:
        torch = _import_torch()
        self._torch = torch
        # a KIND_GPU instance: the module and its inputs on that CUDA device (outputs come back to the CPU)
        self._device = torch.device("cpu") if gpu is None else torch.device(f"cuda:{int(gpu)}")
        name = config.name
        if config.precision not in _PRECISIONS:
            raise ModelConfigError(
                f"model {name!r}: precision {config.precision!r} is not supported by backend torch; "
                f"supported: {', '.join(_PRECISIONS)}"
            )
        _set_interop_once(torch)
        self._threads = int(threads)
        torch.set_num_threads(self._threads)
        self._exported = Path(model_path).suffix.lower() == ".pt2"
        self._in_spec: Any = None  # ExportedProgram: how the flat inputs make (args, kwargs)
        self._flat_dict = False  # ExportedProgram: it returns a flat dict (else leaves in order)
        self._by_keyword = False  # TorchScript: config names are forward's argument names
        program: Any = None
        try:
            if self._exported:
                program = torch.export.load(str(model_path))
                self._module = program.module().to(self._device)
            else:
                with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript; we still serve it
                    warnings.filterwarnings(
                        "ignore", message=".*torch.jit.load.* is deprecated", category=DeprecationWarning
                    )
                    self._module = torch.jit.load(str(model_path), map_location=self._device)
        except Exception as exc:
            kind = "torch.export.load" if self._exported else "torch.jit.load"
            raise ModelConfigError(f"model {name!r}: {kind} cannot load {model_path}: {exc}") from None
        if not self._exported:
            self._module.eval()  # a program's train/eval mode is fixed at export (eval() raises)
        sig = self._export_signature(program, config) if self._exported else self._script_signature(config)
        sig = _rename_by_position(config, sig)
        for spec in (*sig.inputs, *sig.outputs):
            if spec.datatype is DataType.BYTES:
                raise ModelConfigError(f"model {name!r}: tensor {spec.name!r} is BYTES, which torch cannot hold")
        self.inputs: tuple[TensorSpec, ...] = sig.inputs
        self.outputs: tuple[TensorSpec, ...] = sig.outputs
        self.max_batch_size: int = sig.max_batch_size
        self.config: ModelConfig = complete_config(config, sig)
        cast = _PRECISIONS[config.precision]
        self._compute = getattr(torch, cast) if cast else None
        if self._compute is not None:
            self._module.to(self._compute)
        self._input_names = [s.name for s in self.inputs]
        self._out_dtypes = {s.name: getattr(torch, _torch_name(s.datatype)) for s in self.outputs}
        params = [p.dtype for p in self._module.parameters() if p.is_floating_point()]
        self.info: dict[str, Any] = {
            "backend": "torch",
            "version": torch.__version__,
            "precision": _precision_of(params),
            "threads": torch.get_num_threads(),
            "inter_op_threads": torch.get_num_interop_threads(),
            "device": "CPU" if gpu is None else f"GPU:{gpu}",
            "performance_hint": None,
            "format": "torch.export" if self._exported else "torchscript",
            "model_path": str(model_path),
        }

    def _script_signature(self, config: ModelConfig) -> ModelSignature:
        """TorchScript: the config is the signature; its inputs are checked against ``forward``."""
        if not config.inputs or not config.outputs:
            raise ModelConfigError(
                f"model {config.name!r}: a TorchScript model (model.pt) declares no tensor names or shapes; "
                f"list every input and output in config.yaml (name, data_type, dims), or serve a "
                f"torch.export program (model.pt2), whose signature is read from the file"
            )
        args = self._module.forward.schema.arguments[1:]  # [0] is self
        required = [a.name for a in args if not a.has_default_value()]
        if not len(required) <= len(config.inputs) <= len(args):
            raise ModelConfigError(
                f"model {config.name!r}: config lists {len(config.inputs)} inputs, the TorchScript forward "
                f"takes {[a.name for a in args]} ({len(required)} required)"
            )
        names = {s.name for s in config.inputs}
        self._by_keyword = names <= {a.name for a in args}
        if self._by_keyword and set(required) - names:
            raise ModelConfigError(
                f"model {config.name!r}: config inputs {sorted(names)} leave out the TorchScript forward's "
                f"required {sorted(set(required) - names)}"
            )
        return ModelSignature(config.inputs, config.outputs, config.max_batch_size or 0)

    def _export_signature(self, program: Any, config: ModelConfig) -> ModelSignature:
        """ExportedProgram: names, dtypes and shapes from the graph's placeholders and outputs."""
        self._in_spec = program.call_spec.in_spec
        user = set(program.graph_signature.user_inputs)
        nodes = list(program.graph.nodes)
        ins = [(n.name, n.meta.get("val")) for n in nodes if n.op == "placeholder" and n.name in user]
        out_nodes = list(next(n for n in nodes if n.op == "output").args[0])
        out_nodes = out_nodes[len(out_nodes) - len(program.graph_signature.user_outputs) :]  # mutations first
        out_spec = program.call_spec.out_spec
        flat_dict = out_spec.type is dict and out_spec.num_leaves == len(out_spec.context)  # one tensor a key
        keys = out_spec.context if flat_dict else None
        outs = [(str(keys[i]) if keys else f"output__{i}", n.meta.get("val")) for i, n in enumerate(out_nodes)]
        self._flat_dict = keys is not None
        raw_in, raw_out = _raw(config, ins), _raw(config, outs)
        sig = detect_signature(raw_in, raw_out)
        bound = _batch_bound(program, [v for _, v in ins])
        if sig.max_batch_size and bound is not None:
            if config.max_batch_size and config.max_batch_size > bound:
                raise ModelConfigError(
                    f"model {config.name!r}: config max_batch_size {config.max_batch_size}, but the exported "
                    f"program's batch dim is at most {bound}"
                )
            sig = replace(sig, max_batch_size=min(sig.max_batch_size, bound))
        return sig

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch; see :meth:`frameserve.backends.Session.run`. Inputs are shared with
        torch (DLPack), outputs are numpy views of torch's tensors (copied only when torch's
        tensor is not contiguous, or when cast back from a reduced precision).

        Raises:
            InferenceError: torch failed (its message is kept), or the model returned other
                outputs (count, names or dtypes) than the config lists.
        """
        torch = self._torch
        name = self.config.name
        torch.set_num_threads(self._threads)
        try:
            with torch.inference_mode():
                feed = [self._to_torch(inputs[n]) for n in self._input_names]
                if self._exported:
                    args, kwargs = torch.utils._pytree.tree_unflatten(feed, self._in_spec)
                    result = self._module(*args, **kwargs)
                elif self._by_keyword:
                    result = self._module(**dict(zip(self._input_names, feed, strict=True)))
                else:
                    result = self._module(*feed)
                return self._collect(result)
        except InferenceError:
            raise
        except Exception as exc:
            raise InferenceError(f"model {name!r}: torch failed: {exc}") from exc

    def _to_torch(self, arr: np.ndarray[Any, Any]) -> Any:
        torch = self._torch
        if arr.dtype.name == "bfloat16":  # ml_dtypes: numpy has no DLPack code for it
            tensor = torch.from_dlpack(arr.view(np.uint16)).view(torch.bfloat16)
        else:
            tensor = torch.from_dlpack(arr)
        if self._compute is not None and tensor.is_floating_point():
            tensor = tensor.to(self._compute)
        return tensor if self._device.type == "cpu" else tensor.to(self._device)

    def _collect(self, result: Any) -> dict[str, np.ndarray[Any, Any]]:
        name = self.config.name
        if self._exported and not self._flat_dict:
            result = self._torch.utils._pytree.tree_leaves(result)  # the out_spec's order
        if isinstance(result, Mapping):
            missing = [n for n in self._out_dtypes if n not in result]
            if missing:
                raise InferenceError(f"model {name!r}: the model returned keys {sorted(result)}, no {missing}")
            tensors = [result[n] for n in self._out_dtypes]
        else:
            tensors = list(result) if isinstance(result, (tuple, list)) else [result]
            if len(tensors) != len(self._out_dtypes):
                raise InferenceError(
                    f"model {name!r}: the model returned {len(tensors)} outputs, the config lists "
                    f"{len(self._out_dtypes)} ({', '.join(self._out_dtypes)})"
                )
        return {n: self._to_numpy(n, t) for n, t in zip(self._out_dtypes, tensors, strict=True)}

    def _to_numpy(self, out_name: str, tensor: Any) -> np.ndarray[Any, Any]:
        torch = self._torch
        if not isinstance(tensor, torch.Tensor):
            raise InferenceError(
                f"model {self.config.name!r}: output {out_name!r} is a {type(tensor).__name__}, not a tensor"
            )
        want = self._out_dtypes[out_name]
        if tensor.dtype != want:
            if self._compute is None or not (tensor.is_floating_point() and want.is_floating_point):
                raise InferenceError(
                    f"model {self.config.name!r}: output {out_name!r} is {tensor.dtype}, the config says "
                    f"{_DATATYPES[_torch_name_of(want)].value}"
                )
            tensor = tensor.to(want)
        tensor = tensor.detach().cpu().contiguous()  # no-ops (no copy) for a contiguous CPU tensor
        if tensor.dtype == torch.bfloat16:
            return np.from_dlpack(tensor.view(torch.uint16)).view(DataType.BF16.to_numpy())
        return np.from_dlpack(tensor)

    def close(self) -> None:
        """Drop the module."""
        self.__dict__.pop("_module", None)

    def __repr__(self) -> str:
        return f"TorchSession({self.config.name!r}, {self.info['format']}, threads={self._threads})"


def _torch_name_of(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_name(datatype: DataType) -> str:
    return next(torch_name for torch_name, dt in _DATATYPES.items() if dt is datatype)  # BYTES refused before


def _precision_of(param_dtypes: Sequence[Any]) -> str:
    """``fp32``/``bf16``/``fp16`` after the floating parameters' dtype (``fp32`` when none)."""
    names = {_torch_name_of(d) for d in param_dtypes}
    return {"bfloat16": "bf16", "float16": "fp16"}.get(names.pop(), "fp32") if len(names) == 1 else "fp32"


def _raw(config: ModelConfig, tensors: list[tuple[str, Any]]) -> list[RawTensor]:
    out: list[RawTensor] = []
    for tname, val in tensors:
        dtype = getattr(val, "dtype", None)
        datatype = _DATATYPES.get(_torch_name_of(dtype)) if dtype is not None else None
        if datatype is None or not hasattr(val, "shape"):
            raise ModelConfigError(
                f"model {config.name!r}: exported tensor {tname!r} is {type(val).__name__}"
                f"{f' of {dtype}' if dtype is not None else ''}, which frameserve cannot serve"
            )
        out.append((tname, datatype, [d if isinstance(d, int) else -1 for d in val.shape]))
    return out


def _batch_bound(program: Any, values: list[Any]) -> int | None:
    """The exported program's upper bound on the first input's dynamic first dim, if finite."""
    if not values or not len(values[0].shape):
        return None
    expr = getattr(getattr(values[0].shape[0], "node", None), "expr", None)
    bound = program.range_constraints.get(expr)
    return int(bound.upper) if bound is not None and bool(bound.upper < 2**31) else None


def _rename_by_position(config: ModelConfig, sig: ModelSignature) -> ModelSignature:
    """Config names that differ from the model's take the model's tensors by position, when the
    config lists as many as the model has (e.g. ``INPUT__0`` for ``x``)."""
    renamed: dict[str, tuple[TensorSpec, ...]] = {}
    for kind, given, have in (("inputs", config.inputs, sig.inputs), ("outputs", config.outputs, sig.outputs)):
        if given and {s.name for s in given} - {s.name for s in have} and len(given) == len(have):
            renamed[kind] = tuple(replace(h, name=g.name) for g, h in zip(given, have, strict=True))
    return replace(sig, inputs=renamed.get("inputs", sig.inputs), outputs=renamed.get("outputs", sig.outputs))
