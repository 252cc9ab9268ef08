"""What ``perf`` and ``tune`` measure, both through one path: a model behind the server's own
batcher and instances in this process (:class:`ServiceTarget`, each layout loaded with
:func:`layout_override` or a tuned config), or a v2 server over HTTP or gRPC (:class:`ServerTarget`,
Triton's client, ``tritonclient``); and the random inputs they send, shaped by the model's
declared dims (:func:`make_inputs`, :func:`config_dims`).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from frameserve.errors import (
    BackendUnavailableError,
    FrameserveError,
    InferenceError,
    InvalidInputError,
    ModelNotFoundError,
)
from frameserve.repository import ModelConfig, ModelRepository
from frameserve.request import InferRequest
from frameserve.types import DataType, TensorSpec

if TYPE_CHECKING:
    from frameserve.service import InferenceService

__all__ = [
    "MAX_INPUT_BYTES",
    "ServerTarget",
    "ServiceTarget",
    "config_dims",
    "layout_override",
    "make_inputs",
    "parse_shape",
    "ModelFile",
    "model_file",
    "resolve_model",
]

MAX_INPUT_BYTES = 1 << 31
"""Largest request ``make_inputs`` builds (2 GiB): a typo in ``--shape`` fails at once instead of
exhausting memory."""


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME:D1xD2x...`` (``images:3x320x320``; the last ``:`` splits, so ``input:0:3x224x224``
    names ``input:0``) into the input's name and dims.

    Raises:
        InvalidInputError: not of that form, or a dim that is not a positive integer.
    """
    name, sep, dims = text.rpartition(":")
    parts = dims.lower().split("x") if dims else []
    if not sep or not name or not parts or not all(re.fullmatch(r"[1-9][0-9]*", p) for p in parts):
        raise InvalidInputError(f"--shape {text!r}: expected NAME:D1xD2x... with positive sizes (images:3x320x320)")
    return name, tuple(int(p) for p in parts)


def config_dims(spec: TensorSpec, max_batch_size: int, given: tuple[int, ...]) -> tuple[int, ...]:
    """An input's dims as its config declares them, with ``given`` (a ``--shape``) in place of
    its variable (-1) dims: without the batch dim when the model batches (``max_batch_size >
    0``; a leading batch dim in ``given`` is dropped), with the model's leading dim when it does
    not (``max_batch_size`` 0; a ``given`` without it, the per-sample dims, gets the leading 1
    back, so ``lr:3x32x32`` fits dims ``[1, 3, -1, -1]``). NCHW and NHWC alike: dims are matched
    by position.

    Raises:
        InvalidInputError: ``given`` does not fit the dims (rank, or a fixed dim that differs).
    """
    dims = tuple(spec.dims)
    if max_batch_size > 0 and len(given) == len(dims) + 1:
        given = given[1:]  # a leading batch dim: each --batch value replaces it
    elif max_batch_size == 0 and len(given) == len(dims) - 1 and dims and dims[0] in (1, -1):
        given = (1, *given)  # the per-sample dims of a model fed one sample at a time
    if len(given) != len(dims) or any(d != -1 and d != g for d, g in zip(dims, given, strict=True)):
        raise InvalidInputError(
            f"--shape {spec.name}:{'x'.join(map(str, given))} does not fit the model's dims {list(dims)} "
            f"(-1 = any size{'; the batch dim is left out' if max_batch_size > 0 else ''})"
        )
    return tuple(given)


def _shape_for(spec: TensorSpec, max_batch_size: int, batch: int, given: tuple[int, ...] | None) -> tuple[int, ...]:
    dims = tuple(spec.dims) if given is None else config_dims(spec, max_batch_size, given)
    if any(d == -1 for d in dims):
        raise InvalidInputError(
            f"input {spec.name!r} has variable dims {list(dims)} (-1 = any size); give its shape with "
            f"--shape {spec.name}:{'x'.join('N' if d == -1 else str(d) for d in dims)}"
        )
    return (batch, *dims) if max_batch_size > 0 else tuple(dims)


def make_inputs(
    specs: Sequence[TensorSpec],
    *,
    max_batch_size: int,
    batch: int,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray[Any, Any]]:
    """Random inputs for one request: floats uniform in [0, 1), integers in [0, 10), booleans
    half true, BYTES elements ``b"frameserve"``.

    Args:
        specs: the model's inputs (dims without the batch dim when ``max_batch_size > 0``).
        max_batch_size: the model's; 0 = it does not batch (then ``batch`` must be 1).
        batch: samples in the request (the leading dim when batching).
        shapes: dims for inputs with variable (-1) dims, by input name, without the batch dim
            (a leading batch dim is accepted and replaced by ``batch``).
        seed: random seed (the same inputs for the same arguments).

    Raises:
        InvalidInputError: a variable dim without a shape, a shape that does not fit, a shape for
            no such input, ``batch`` > 1 for a model that does not batch or over its
            ``max_batch_size``, or a request over :data:`MAX_INPUT_BYTES`.
    """
    shapes = dict(shapes or {})
    unknown = sorted(set(shapes) - {s.name for s in specs})
    if unknown:
        raise InvalidInputError(
            f"--shape names no input of the model: {', '.join(unknown)}; inputs: {', '.join(s.name for s in specs)}"
        )
    if max_batch_size == 0 and batch != 1:
        raise InvalidInputError(f"the model does not batch (max_batch_size 0): use batch 1, not {batch}")
    if max_batch_size > 0 and batch > max_batch_size:
        raise InvalidInputError(f"batch {batch} is over the model's max_batch_size {max_batch_size}")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray[Any, Any]] = {}
    total = 0
    for spec in specs:
        shape = _shape_for(spec, max_batch_size, batch, shapes.get(spec.name))
        size = math.prod(shape)
        total += size * (spec.datatype.size_bytes or len(b"frameserve"))
        if total > MAX_INPUT_BYTES:
            raise InvalidInputError(f"inputs of {list(shape)} come to over {MAX_INPUT_BYTES >> 30} GiB per request")
        dt = spec.datatype
        if dt is DataType.BYTES:
            arr = np.full(shape, b"frameserve", dtype=object)
        elif dt is DataType.BOOL:
            arr = rng.random(shape) < 0.5
        elif dt in (DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16):
            arr = rng.random(shape, dtype=np.float32).astype(dt.to_numpy())
        else:
            arr = rng.integers(0, 10, size=shape).astype(dt.to_numpy())
        out[spec.name] = arr
    return out


def resolve_model(source: Path | str, model: str | None) -> tuple[ModelRepository, str]:
    """The repository and model name for ``perf SOURCE [--model NAME]``: ``SOURCE`` is either a
    model folder (it has numbered version folders; its name is the model's) or a repository.

    Raises:
        ModelConfigError: ``SOURCE`` is not a folder.
        ModelNotFoundError: no such model, or a repository of several models and no ``model``.
    """
    path = Path(source)
    has_versions = path.is_dir() and any(p.is_dir() and p.name.isdigit() for p in path.iterdir())
    if has_versions and model in (None, path.name):
        return ModelRepository(path.resolve().parent), path.resolve().name
    repo = ModelRepository(path)
    if model is None:
        names = repo.models()
        if len(names) != 1:
            raise ModelNotFoundError(
                f"{path} holds {len(names)} models ({', '.join(names) or 'none'}); name one with --model"
            )
        model = names[0]
    repo.model_dir(model)
    return repo, model


@dataclass(frozen=True)
class ModelFile:
    """A served model's newest (or a named) version, as ``perf``, ``tune`` and ``quantize`` read it.

    Attributes:
        repo: the repository that holds it.
        name: the model's name.
        config: its parsed config.
        version: the version measured.
        path: that version's model file (:meth:`ModelRepository.model_file`).
    """

    repo: ModelRepository
    name: str
    config: ModelConfig
    version: int
    path: Path


def model_file(source: Path | str, model: str | None = None, version: int | None = None) -> ModelFile:
    """The model of ``SOURCE [--model NAME]`` (see :func:`resolve_model`) and its model file, at
    ``version`` or else the newest version its version policy serves.

    Raises:
        ModelConfigError, ModelNotFoundError: as :func:`resolve_model` and
            :meth:`ModelRepository.model_file`.
        InvalidInputError: ``version`` is None and the policy serves no version folder.
    """
    repo, name = resolve_model(source, model)
    config = repo.config(name)
    if version is None:
        served = repo.versions(name)
        if not served:
            raise InvalidInputError(f"model {name!r} has no version folder its version policy serves")
        version = served[-1]
    return ModelFile(repo, name, config, version, repo.model_file(name, version, config=config))


def layout_override(raw: Mapping[str, Any], instances: int, threads: int) -> dict[str, Any]:
    """The load override (:meth:`InferenceService.load`'s ``config_override``) that runs a model
    as ``instances`` CPU instances of ``threads`` intra-op threads each, the rest of its
    config.yaml (``raw``) as it is: how ``perf`` sweeps layouts through the server's own path."""
    params = {**dict(raw.get("parameters") or {}), "threads": str(int(threads))}
    return {"instance_group": [{"count": int(instances), "kind": "KIND_CPU"}], "parameters": params}


def _process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid`` (``None`` = this one) and its
    children; ``None`` when the process is gone or not ours to read."""
    import psutil

    try:
        proc = psutil.Process(pid)
        total = 0.0
        for p in (proc, *proc.children(recursive=True)):
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total
    except psutil.Error:
        return None


class _ServiceWorker:
    def __init__(self, target: ServiceTarget) -> None:
        self._t = target

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> None:
        t = self._t
        t.service.submit(InferRequest(t.model, inputs, model_version=t.version)).result()

    def close(self) -> None:
        return None


class ServiceTarget:
    """A model loaded in an in-process :class:`~frameserve.service.InferenceService`: each
    request goes through the model's dynamic batcher and instance pool, as on ``serve``, without
    the transport (so batching parameters, instances and pinning all count).

    Args:
        service: the service (anything with ``submit(InferRequest) -> Future``).
        model: the loaded model's name.
        version: the version (``None``: the highest loaded).
    """

    def __init__(self, service: InferenceService, model: str, version: int | None = None) -> None:
        self.service, self.model, self.version = service, model, version

    def worker(self) -> _ServiceWorker:
        """A handle that submits each request and waits for its answer."""
        return _ServiceWorker(self)

    def cpu_seconds(self) -> float | None:
        """CPU seconds of this process: the instances' threads, the batcher and the callers."""
        return _process_cpu_s(None)


Transport = Literal["http", "grpc"]


def _tritonclient(protocol: Transport) -> Any:  # Any: tritonclient.http or .grpc (modules without types)
    try:
        if protocol == "http":
            import tritonclient.http as client
        else:
            import tritonclient.grpc as client
    except ImportError as exc:
        raise BackendUnavailableError(
            f"measuring a model served over {protocol} (perf --url, tune's finalists) needs Triton's client: pip install 'tritonclient[{protocol}]' "
            f"(or 'frameserve[tune]'); import failed: {exc}"
        ) from None
    return client


def _address(address: str, protocol: Transport) -> tuple[str, bool]:
    """``host:port`` and whether to use TLS, from ``http://host:8000`` / ``https://...`` / ``host:8001``."""
    m = re.fullmatch(r"(?:(https?|grpcs?)://)?([^/\s]+?)/?", address.strip())
    if not m or ":" not in m.group(2):
        raise InvalidInputError(f"server address {address!r}: expected host:port or http(s)://host:port")
    return m.group(2), m.group(1) in ("https", "grpcs")


class _ClientWorker:
    def __init__(self, target: ServerTarget) -> None:
        self._t = target
        mod = target._client
        host, ssl = _address(target.address, target.protocol)
        if target.protocol == "http":
            self._client = mod.InferenceServerClient(
                host, ssl=ssl, connection_timeout=target.timeout_s, network_timeout=target.timeout_s
            )
        else:
            self._client = mod.InferenceServerClient(host, ssl=ssl)
        self._key: int | None = None
        self._inputs: list[Any] = []
        self._outputs = [
            mod.InferRequestedOutput(name, binary_data=True)
            if target.protocol == "http"
            else mod.InferRequestedOutput(name)
            for name in target.output_names
        ]

    def infer(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> None:
        mod = self._t._client
        if self._key != id(inputs):  # the same request is sent again and again: build it once
            self._inputs = []
            for name, arr in inputs.items():
                item = mod.InferInput(name, list(arr.shape), DataType.from_numpy(arr.dtype).value)
                if self._t.protocol == "http":
                    item.set_data_from_numpy(arr, binary_data=True)
                else:
                    item.set_data_from_numpy(arr)
                self._inputs.append(item)
            self._key = id(inputs)
        kwargs: dict[str, Any] = {
            "model_version": self._t.version or "",
            "outputs": self._outputs,
            "headers": self._t.headers,
        }
        if self._t.protocol == "grpc":
            kwargs["client_timeout"] = self._t.timeout_s
        try:
            self._client.infer(self._t.model, self._inputs, **kwargs)
        except Exception as exc:  # tritonclient's InferenceServerException, socket errors
            raise InferenceError(f"model {self._t.model!r} at {self._t.address}: {exc}") from None

    def close(self) -> None:
        """Close the client; over HTTP, also this thread's gevent hub (see :func:`_drop_gevent_hub`)."""
        self._client.close()
        if self._t.protocol == "http":
            _drop_gevent_hub()


def _drop_gevent_hub() -> None:
    """Destroy the calling thread's gevent hub, and its loop, unless this is the main thread.

    tritonclient's HTTP client runs on gevent (geventhttpclient), and gevent gives each native
    thread that uses it a hub of its own. gevent's ``Hub.destroy`` docs: whoever uses the gevent
    API from several native threads *should* destroy each thread's hub before dropping it, ideally
    in that thread. A measurement's worker threads end here, so their hubs are destroyed here and
    not left for the garbage collector of whichever thread runs next (libev watchers freed after
    their loop)."""
    if threading.current_thread() is threading.main_thread():
        return
    try:
        import gevent
    except ImportError:  # pragma: no cover - tritonclient[http] depends on gevent
        return
    gevent.get_hub().destroy(destroy_loop=True)


class ServerTarget:
    """A model served by a v2 (KServe / Triton) server, loaded through ``tritonclient``: one
    client per caller thread, binary tensors.

    Args:
        address: ``http://host:8000`` / ``host:8000`` (HTTP) or ``host:8001`` (gRPC).
        protocol: ``http`` or ``grpc``.
        model: the model's name.
        version: the version to load ("" / ``None`` = the server's choice).
        server_pid: the server's process id on this machine: its CPU seconds (with its
            children's) are measured; ``None`` = unknown.
        timeout_s: per-request timeout.
        token: a bearer token for a server with ``--auth-token-file`` (sent as
            ``Authorization: Bearer ...`` on every call; never in a message); ``None``: none.

    Raises:
        BackendUnavailableError: tritonclient is not installed (names the package).
        InvalidInputError: a malformed address, or no server answers there.
        ModelNotFoundError: the server has no ready model of that name.
    """

    def __init__(
        self,
        address: str,
        *,
        protocol: Transport,
        model: str,
        version: str | None = None,
        server_pid: int | None = None,
        timeout_s: float = 60.0,
        token: str | None = None,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise InvalidInputError(f"protocol {protocol!r}; accepted: http, grpc")
        self._client = _tritonclient(protocol)
        self.address, self.protocol, self.model = address, protocol, model
        self.version = version or ""
        self.server_pid = server_pid
        self.timeout_s = timeout_s
        self.headers: dict[str, str] | None = (
            {"authorization": f"Bearer {token}"} if token else None
        )  # gRPC metadata keys are lowercase
        host, ssl = _address(address, protocol)
        if protocol == "http":
            client = self._client.InferenceServerClient(
                host, ssl=ssl, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        else:
            client = self._client.InferenceServerClient(host, ssl=ssl)
        try:
            headers = self.headers
            try:
                live = client.is_server_live(headers=headers)
            except Exception as exc:
                raise InvalidInputError(f"no v2 server answers at {address} ({protocol}): {exc}") from None
            if not live:
                raise InvalidInputError(f"the server at {address} is not live")
            as_json = {} if protocol == "http" else {"as_json": True}
            try:
                ready = client.is_model_ready(model, self.version, headers=headers)
            except Exception:
                ready = False
            if not ready:  # the server's own words where it has some (a refused token, an unknown model)
                try:
                    client.get_model_metadata(model, self.version, headers=headers, **as_json)
                    why = "it is not ready"
                except Exception as exc:
                    why = str(exc)
                raise ModelNotFoundError(f"the server at {address} has no ready model {model!r}: {why}")
            meta = client.get_model_metadata(model, self.version, headers=headers, **as_json)
            config = client.get_model_config(model, self.version, headers=headers, **as_json)
        except FrameserveError:
            raise
        except Exception as exc:
            raise InvalidInputError(f"the server at {address} did not describe model {model!r}: {exc}") from None
        finally:
            client.close()
        config = config.get("config", config)
        self.max_batch_size = int(config.get("max_batch_size", 0) or 0)
        cut = 1 if self.max_batch_size > 0 else 0
        self.inputs = tuple(
            TensorSpec(t["name"], DataType.parse(t["datatype"]), tuple(int(d) for d in t["shape"][cut:]))
            for t in meta.get("inputs", [])
        )
        self.output_names = tuple(t["name"] for t in meta.get("outputs", []))
        self.info: dict[str, Any] = {
            "backend": config.get("backend") or config.get("platform"),
            "platform": config.get("platform"),
            "max_batch_size": self.max_batch_size,
            "instance_group": config.get("instance_group"),
            "parameters": {k: v.get("string_value") for k, v in (config.get("parameters") or {}).items()},
        }

    def worker(self) -> _ClientWorker:
        """A client of its own for the calling thread."""
        return _ClientWorker(self)

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the server process and its children (``None`` without ``server_pid``)."""
        return None if self.server_pid is None else _process_cpu_s(self.server_pid)
