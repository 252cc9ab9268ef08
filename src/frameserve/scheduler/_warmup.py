"""Model warmup (Triton's ``model_warmup``, ``docs/user_guide/model_configuration.md``, "Model
Warmup"): each sample runs ``count`` times (at least once) on every instance as it is opened,
before the model version is served; a sample that fails fails the load.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends import Session
from frameserve.errors import FrameserveError, ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.repository._features import WarmupInput, WarmupSample
from frameserve.types import DataType

__all__ = ["run_warmup", "warmup_inputs"]

_MAX_FILE_BYTES = 1 << 30


def _strings(raw: bytes, count: int, where: str) -> np.ndarray[Any, Any]:
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise ModelConfigError(f"{where}: the file holds fewer than {count} strings")
        (n,) = struct.unpack_from("<I", raw, offset)
        if offset + 4 + n > len(raw):
            raise ModelConfigError(f"{where}: string {i} runs past the end of the file")
        out[i] = raw[offset + 4 : offset + 4 + n]
        offset += 4 + n
    return out


def _data(
    spec: WarmupInput, shape: tuple[int, ...], model_dir: Path | None, rng: np.random.Generator, where: str
) -> np.ndarray[Any, Any]:
    count = int(np.prod(shape, dtype=np.int64))
    dt = spec.datatype
    if spec.data == "input_data_file":
        if model_dir is None:
            raise ModelConfigError(f"{where}: input_data_file needs the model's folder (a model of a repository)")
        path = model_dir / "warmup" / str(spec.data_file)
        try:
            if path.stat().st_size > _MAX_FILE_BYTES:
                raise ModelConfigError(f"{where}: warmup file over 1 GiB")
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(f"{where}: cannot read warmup/{spec.data_file}: {type(exc).__name__}") from None
        if dt is DataType.BYTES:
            return _strings(raw, count, where).reshape(shape)
        np_dtype = dt.to_numpy().newbyteorder("<")
        need = count * np_dtype.itemsize
        if len(raw) != need:
            raise ModelConfigError(
                f"{where}: warmup/{spec.data_file} holds {len(raw)} bytes; shape {list(shape)} of {dt.value} needs {need}"
            )
        return np.frombuffer(raw, dtype=np_dtype).astype(dt.to_numpy()).reshape(shape)
    if dt is DataType.BYTES:
        return np.full(shape, b"", dtype=object)
    np_dtype = dt.to_numpy()
    if spec.data == "zero_data":
        return np.zeros(shape, dtype=np_dtype)
    if dt is DataType.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np_dtype.kind == "f":
        return rng.random(size=shape, dtype=np.float64).astype(np_dtype)
    return rng.integers(0, 10, size=shape).astype(np_dtype)


def warmup_inputs(
    config: ModelConfig, sample: WarmupSample, model_dir: Path | None, *, seed: int = 0
) -> dict[str, np.ndarray[Any, Any]]:
    """The batch one run of ``sample`` feeds the model: every model input, shaped
    ``[batch_size, *dims]`` when the model batches, else ``dims``; checked against the config.

    Raises:
        ModelConfigError: the sample misses a model input or names an unknown one, a batch size
            over ``max_batch_size`` (or > 1 for a model that does not batch), a datatype or shape
            the model does not take, or an unreadable or short data file.
    """
    mbs = config.max_batch_size or 0
    where = f"model {config.name!r} warmup sample {sample.name!r}"
    if (mbs > 0 and sample.batch_size > mbs) or (mbs == 0 and sample.batch_size != 1):
        raise ModelConfigError(f"{where}: batch_size {sample.batch_size} exceeds the model's max_batch_size {mbs or 1}")
    names = [s.name for s in config.inputs]
    unknown = sorted(set(sample.inputs) - set(names))
    missing = [n for n in names if n not in sample.inputs]
    if unknown or missing:
        raise ModelConfigError(
            f"{where}: inputs must be the model's inputs {names}; missing {missing}, unknown {unknown[:5]}"
        )
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for spec in config.inputs:
        given = sample.inputs[spec.name]
        here = f"{where} input {spec.name!r}"
        if given.datatype is not spec.datatype:
            raise ModelConfigError(f"{here}: data_type {given.datatype.value}, the model takes {spec.datatype.value}")
        one = _data(given, given.dims, model_dir, rng, here)
        array = np.stack([one] * sample.batch_size) if mbs > 0 else one
        try:
            spec.check(array, mbs)
        except FrameserveError as exc:
            raise ModelConfigError(f"{here}: {exc.message}") from None
        out[spec.name] = array
    return out


def run_warmup(session: Session, model_dir: Path | None) -> None:
    """Run every warmup sample of ``session.config`` on ``session`` (each ``count`` times, at
    least once); ``model_dir`` is the model's folder (for ``warmup/<input_data_file>``).

    Raises:
        ModelConfigError: a sample cannot be built (:func:`warmup_inputs`) or a run of it
            failed; the message names the sample and carries the backend's error.
    """
    config = session.config
    for sample in config.model_warmup:
        inputs = warmup_inputs(config, sample, model_dir)
        for _ in range(sample.runs):
            try:
                session.run(inputs)
            except FrameserveError as exc:
                raise ModelConfigError(
                    f"model {config.name!r} warmup sample {sample.name!r} failed: {exc.message}"
                ) from None
            except Exception as exc:  # a backend's own error type
                raise ModelConfigError(
                    f"model {config.name!r} warmup sample {sample.name!r} failed: {type(exc).__name__}: {exc}"
                ) from None
