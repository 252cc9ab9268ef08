"""Triton's response cache (``docs/user_guide/response_cache.md``): a server-wide LRU cache of
inference results, bounded in bytes (``--cache-config local,size=N``), used by models whose
config has ``response_cache { enable: true }``.

A request's key is a BLAKE2b-256 digest of everything that decides its answer: the model's name
and version, each input's name, datatype, shape and full bytes (inputs in name order), the
outputs asked for with their parameters (e.g. ``classification``), the request's free
parameters, and its tenant; each field is length-prefixed, so two different requests never feed
the hash the same bytes and a client cannot make two requests collide short of breaking BLAKE2b.
Requests with a BYTES input, or that belong to a sequence (``sequence_id``), are not cached, as
in Triton.

The tenant is part of the key because a hit is answered much sooner than a miss: a result one
tenant's request left behind, answering another tenant's request, would tell the second tenant
what the first one asked (a cache timing side channel). Each tenant hits only its own results;
without tokens there is one tenant and the cache behaves as Triton's. A request made for several
tenants at once (:data:`~frameserve.request.SEVERAL_TENANTS`) is not cached.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from frameserve._lru import ByteLRU
from frameserve.errors import ModelConfigError
from frameserve.request import SEVERAL_TENANTS, InferRequest
from frameserve.scheduler._request import Outputs

__all__ = ["ResponseCache", "parse_cache_config"]

_ENTRY_OVERHEAD_BYTES = 256  # the key, the dict and the arrays' headers, roughly


def parse_cache_config(text: str) -> int:
    """The size in bytes of Triton's ``--cache-config local,size=N`` (also ``local,size=N``
    given as ``size=N`` alone).

    Raises:
        ModelConfigError: another cache implementation (only ``local`` exists here), or a size
            that is not an integer >= 0.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts and "=" not in parts[0]:
        if parts[0] != "local":
            raise ModelConfigError(f"--cache-config: cache {parts[0][:64]!r} unknown; accepted: local")
        parts = parts[1:]
    size = None
    for part in parts:
        key, _, value = part.partition("=")
        if key.strip() != "size":
            raise ModelConfigError(f"--cache-config: setting {key.strip()[:64]!r} unknown; accepted: size")
        try:
            size = int(value.strip())
        except ValueError:
            size = -1
        if size < 0:
            raise ModelConfigError("--cache-config: size must be an integer number of bytes >= 0")
    if size is None:
        raise ModelConfigError("--cache-config: give the size in bytes: local,size=N")
    return size


def _outputs_bytes(outputs: Mapping[str, np.ndarray[Any, Any]]) -> int:
    total = _ENTRY_OVERHEAD_BYTES
    for name, array in outputs.items():
        total += len(name) + 64
        if array.dtype.kind == "O":
            total += sum(len(x) if isinstance(x, bytes | str) else 64 for x in array.flat) + 8 * array.size
        else:
            total += array.nbytes
    return total


class ResponseCache:
    """An LRU cache of inference results bounded by ``size_bytes``. Thread-safe.

    Args:
        size_bytes: the most bytes the held results take (their arrays' bytes plus a small
            per-entry overhead); a result larger than that is never held.

    Attributes:
        size_bytes: the bound.
        used_bytes: bytes held now.
        evictions: results dropped to make room, since start.
    """

    def __init__(self, size_bytes: int) -> None:
        if size_bytes < 0:
            raise ModelConfigError(f"response cache size must be >= 0 bytes, got {size_bytes}")
        self.size_bytes = int(size_bytes)
        self._lru: ByteLRU[bytes, Outputs] = ByteLRU(self.size_bytes, _outputs_bytes)

    @property
    def used_bytes(self) -> int:
        """Bytes held now."""
        return self._lru.bytes

    @property
    def evictions(self) -> int:
        """Results dropped to make room, since start."""
        return self._lru.evictions

    def __len__(self) -> int:
        return len(self._lru)

    @staticmethod
    def key(request: InferRequest, version: int) -> bytes | None:
        """The request's key (32 bytes; one tenant's key never equals another's), or ``None``
        when it must not be cached (a BYTES input, a ``sequence_id``, the tenant
        :data:`~frameserve.request.SEVERAL_TENANTS`).

        ``request`` must be checked already (its inputs contiguous, as the service queues them).
        """
        params = request.parameters
        if request.sequence_id not in (0, "") or params.get("sequence_id") not in (None, 0, ""):
            return None
        if request.tenant == SEVERAL_TENANTS:  # made from several tenants' data (a BLS call): nobody's to hit
            return None
        h = hashlib.blake2b(digest_size=32, person=b"frameserve-rc1")

        def put(data: bytes | memoryview) -> None:
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)

        put(request.model_name.encode("utf-8", "surrogatepass"))
        put(str(version).encode())
        for name in sorted(request.inputs):
            array = request.inputs[name]
            if array.dtype.kind in "OSU":
                return None
            put(name.encode("utf-8", "surrogatepass"))
            put(array.dtype.str.encode())
            put(repr(tuple(array.shape)).encode())
            put(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)  # 1-D: len() is the byte count
        put(
            repr(
                [(o.name, sorted((str(k), repr(v)) for k, v in o.parameters.items())) for o in request.outputs]
            ).encode()
        )
        put(repr(sorted((str(k), repr(v)) for k, v in params.items())).encode())
        put(request.tenant.encode("utf-8", "surrogatepass"))
        return h.digest()

    def lookup(self, key: bytes) -> Outputs | None:
        """The result held for ``key`` (read-only arrays; marked most recently used), or ``None``."""
        entry = self._lru.get(key)
        return None if entry is None else dict(entry)

    def insert(self, key: bytes, outputs: Mapping[str, np.ndarray[Any, Any]]) -> bool:
        """Hold a copy of ``outputs`` under ``key``, evicting the least recently used results
        until it fits. Returns whether it is held (a result over :attr:`size_bytes` is not)."""
        size = _outputs_bytes(outputs)
        if not self._lru.fits(size):
            return False
        copies: Outputs = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            copies[name] = copy
        self._lru.put(key, copies, size)
        return True
