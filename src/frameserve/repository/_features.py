"""The model configuration's feature fields beyond shapes and scheduling: ``reshape`` of inputs
and outputs, an output's ``label_filename`` (the classification extension), ``model_warmup``
and ``response_cache``.

Source of every field and its meaning: ``ModelTensorReshape``, ``ModelOutput.label_filename``,
``ModelWarmup`` and ``ModelResponseCache`` in triton-inference-server/common
``protobuf/model_config.proto``; Triton's ``docs/user_guide/model_configuration.md``
("Reshape", "Model Warmup") and ``docs/user_guide/response_cache.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from frameserve.errors import ModelConfigError, TensorError
from frameserve.types import DataType

__all__ = ["WarmupInput", "WarmupSample", "check_bare_filename", "is_bare_filename", "parse_warmup", "reshape_of"]

WarmupData = Literal["zero_data", "random_data", "input_data_file"]
_DATA_KINDS: tuple[str, ...] = ("zero_data", "random_data", "input_data_file")
_MAX_FILENAME_BYTES = 255


def is_bare_filename(value: object) -> bool:
    """Whether ``value`` is a string naming a file of one folder: not empty, ``.`` or ``..``, at
    most 255 bytes of UTF-8, without ``/``, ``\\``, ``:`` (a drive) or NUL."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and not any(c in value for c in "/\\:\0")
        and len(value.encode("utf-8", "surrogatepass")) <= _MAX_FILENAME_BYTES
    )


def check_bare_filename(value: object, where: str) -> str:
    """``value`` if it is a bare file name (no folder part), the form of ``label_filename`` and
    of a warmup ``input_data_file``: a request or config never names a file outside its model's
    folder.

    Raises:
        ModelConfigError: not a string, empty, ``.``/``..``, over 255 bytes, or holding ``/``,
            ``\\``, ``:`` or NUL; the message echoes nothing of the value.
    """
    if not is_bare_filename(value):
        raise ModelConfigError(
            f"{where} must be a bare file name (at most 255 bytes; no '/', '\\', ':', NUL, '.' or '..')"
        )
    return str(value)


def reshape_of(item: Mapping[str, Any], where: str) -> tuple[int, ...] | None:
    """An input's or output's ``reshape.shape`` (what the model sees instead of ``dims``, batch
    dimension excluded when batching), or ``None`` without ``reshape``. An empty shape is a
    scalar per batch item, as in Triton.

    Raises:
        ModelConfigError: ``reshape`` is not ``{"shape": [int, ...]}`` of sizes >= 1 or -1.
    """
    raw = item.get("reshape")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("shape", []), list):
        raise ModelConfigError(f"{where}: reshape must be {{shape: [sizes]}}")
    try:
        shape = tuple(int(d) for d in raw.get("shape", []))
    except (TypeError, ValueError):
        raise ModelConfigError(f"{where}: reshape.shape must hold integers") from None
    if any(d < -1 or d == 0 for d in shape):
        raise ModelConfigError(f"{where}: reshape.shape {list(shape)} invalid; each size is positive or -1")
    return shape


@dataclass(frozen=True)
class WarmupInput:
    """One input of a warmup sample (Triton's ``ModelWarmup.Input``).

    Attributes:
        datatype: the input's element type.
        dims: its shape without the batch dimension (sizes >= 1; a warmup shape is concrete).
        data: ``zero_data`` (zeros; empty strings for BYTES), ``random_data`` (uniform [0, 1)
            floats, integers in [0, 10), random bits for BOOL, empty strings for BYTES) or
            ``input_data_file`` (raw row-major little-endian bytes of the file
            ``<model folder>/warmup/<data_file>``; BYTES elements each a 4-byte little-endian
            length and the bytes).
        data_file: the file's bare name for ``input_data_file``, else ``None``.
    """

    datatype: DataType
    dims: tuple[int, ...]
    data: WarmupData
    data_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form."""
        dt = "STRING" if self.datatype is DataType.BYTES else self.datatype.value
        out: dict[str, Any] = {"data_type": f"TYPE_{dt}", "dims": list(self.dims)}
        out[self.data] = self.data_file if self.data == "input_data_file" else True
        return out


@dataclass(frozen=True)
class WarmupSample:
    """One ``model_warmup`` entry: ``count`` runs of a batch of ``batch_size`` made of ``inputs``.

    Attributes:
        name: the sample's name (in error messages).
        batch_size: the batch size of each run (>= 1; 1 for a model that does not batch).
        inputs: input name -> :class:`WarmupInput`.
        count: how many times the sample runs (Triton: 0 means once).
    """

    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput]
    count: int = 1

    @property
    def runs(self) -> int:
        """How many times the sample runs: ``count``, at least 1."""
        return max(1, self.count)

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form."""
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "inputs": {k: v.to_dict() for k, v in sorted(self.inputs.items())},
            "count": self.count,
        }


def _warmup_input(raw: Any, where: str) -> WarmupInput:
    if not isinstance(raw, Mapping):
        raise ModelConfigError(
            f"{where} must be a mapping {{data_type, dims, zero_data | random_data | input_data_file}}"
        )
    try:
        datatype = DataType.parse(raw.get("data_type", ""))
    except TensorError as exc:
        raise ModelConfigError(f"{where}: {exc}") from None
    try:
        dims = tuple(int(d) for d in raw.get("dims", []))
    except (TypeError, ValueError):
        raise ModelConfigError(f"{where}: dims must hold integers") from None
    if any(d < 1 for d in dims):
        raise ModelConfigError(f"{where}: dims {list(dims)}: a warmup shape has sizes >= 1")
    kinds = [k for k in _DATA_KINDS if raw.get(k)]
    if len(kinds) != 1:
        raise ModelConfigError(f"{where}: give exactly one of zero_data, random_data, input_data_file")
    kind: WarmupData = kinds[0]  # type: ignore[assignment]  # one of _DATA_KINDS
    data_file = check_bare_filename(raw[kind], f"{where}: input_data_file") if kind == "input_data_file" else None
    return WarmupInput(datatype, dims, kind, data_file)


def parse_warmup(raw: Any, source: str) -> tuple[WarmupSample, ...]:
    """``model_warmup`` (a list of Triton's ``ModelWarmup`` in JSON form) as samples.

    Raises:
        ModelConfigError: a sample that is not a mapping, a batch size < 1, a negative count, or
            an input as :class:`WarmupInput` refuses it (the message names the sample).
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ModelConfigError(f"{source}: model_warmup must be a list of samples")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ModelConfigError(f"{source}: model_warmup[{i}] must be a mapping")
        name = str(item.get("name", f"sample{i}"))
        where = f"{source}: model_warmup[{i}] ({name!r})"
        batch_size, count = int(item.get("batch_size", 0)), int(item.get("count", 0))
        if batch_size < 1:
            raise ModelConfigError(f"{where}: batch_size must be >= 1, got {batch_size}")
        if count < 0:
            raise ModelConfigError(f"{where}: count must be >= 0, got {count}")
        inputs = item.get("inputs") or {}
        if not isinstance(inputs, Mapping):
            raise ModelConfigError(f"{where}: inputs must map input names to inputs")
        out.append(
            WarmupSample(
                name=name,
                batch_size=batch_size,
                count=count,
                inputs={str(k): _warmup_input(v, f"{where} input {str(k)[:64]!r}") for k, v in inputs.items()},
            )
        )
    return tuple(out)
