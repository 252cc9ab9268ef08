"""Triton's system shared-memory extension, transport-neutral: the registry of client regions
(:class:`SharedMemoryRegistry`, one per server, shared by HTTP and gRPC) and the per-request use
of them (:class:`SharedMemoryUse`: inputs read as numpy views of a region, outputs written into
one).

Protocol (triton-inference-server/server ``docs/protocol/extension_shared_memory.md``; the
semantics of Triton's ``src/shared_memory_manager.cc``):

- A client creates a POSIX shared-memory object (``shm_open``; ``tritonclient.utils.shared_memory``
  and perf_analyzer ``--shared-memory system`` do), then registers a *region* of it: a name, the
  object's key, an offset and a byte size. Registering a name twice is refused; unregistering
  an unknown name is not an error; unregistering with no name drops every region.
- An input or a requested output names a region with the parameters ``shared_memory_region``
  (string), ``shared_memory_byte_size`` (int) and ``shared_memory_offset`` (int, default 0,
  bytes from the start of the region); the first two are required together
  (:func:`shm_location`). An input's bytes are the tensor's wire form (little-endian, row-major;
  BYTES as 4-byte lengths then bytes); an output is written there in the same form and its
  response entry carries no data.

What frameserve adds to Triton's checks:

- keys are single POSIX shm names (``/name``: ``[A-Za-z0-9._-]``, no ``..``), opened under
  ``/dev/shm`` with ``O_NOFOLLOW`` and ``O_NONBLOCK``, regular files only; never a path;
- regions belong to a tenant (the registering token's NAME, ``""`` without tokens): a tenant's
  status lists its own regions, unregister (one or all) touches only its own, and a request may
  name only its own (another tenant's region answers as an unknown one would); two tenants may
  use the same region name. ``admin`` tokens see and unregister every tenant's regions;
- only keys under the operator's prefix (``serve --client-shm-prefix``, default
  :data:`DEFAULT_CLIENT_PREFIX`) can be registered, and never the server's own objects whatever
  the prefix: keys of frameserve's own segments (:data:`OWN_SEGMENT_PREFIX`: the decode ring, the
  Python backend's tensor blocks), POSIX semaphores (``sem.*``), objects with more than one name
  (a hard link can give a server segment a client's name) and objects this process created or
  attached (:func:`mark_own`, by device and inode);
- any offset is accepted (the mapping starts at the page below it), and the segment's size is
  checked again each time a request uses the region, so a client that shrank its segment
  gets an error instead of the server dying of SIGBUS (a client truncating it *during* a request
  can still crash the server: the reason this extension is off unless the server is asked,
  ``serve --allow-client-shm``, as Triton's ``--allow-client-shm`` since 2.66);
- an unregistered region is unusable for new requests at once, but stays mapped until the last
  request using it finishes (reference counts; numpy views of it keep it mapped longer still).

The server opens segments with ``os.open`` + ``mmap``, not ``multiprocessing.shared_memory``,
so Python's resource tracker never learns of (and never unlinks) a client's segment.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from frameserve.errors import (
    ResourceExhaustedError,
    SharedMemoryError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryUnsupportedError,
    TensorError,
    shown,
)
from frameserve.types import DataType, decode_bytes_elements, encode_bytes_elements

__all__ = [
    "DEFAULT_CLIENT_PREFIX",
    "DEFAULT_MAX_REGIONS",
    "EXTENSION",
    "OWN_SEGMENT_PREFIX",
    "SHM_PARAMETERS",
    "SHM_ROOT",
    "SharedMemoryRegistry",
    "SharedMemoryUse",
    "ShmLocation",
    "client_shm_disabled",
    "cuda_shm_unsupported",
    "forget_own",
    "mark_own",
    "shm_location",
]

OWN_SEGMENT_PREFIX = "frameserve-"
"""Name prefix of every POSIX shared-memory segment frameserve creates itself (the decode
ring of ``pipeline._parallel``, the Python backend's tensor blocks); a client key with this prefix
is refused."""

DEFAULT_CLIENT_PREFIX = "/fsclient-"
"""The key prefix client regions must have unless the operator names another
(``serve --client-shm-prefix``; ``/`` allows any key but the server's own objects)."""

EXTENSION = "system_shared_memory"
"""The extension's name in ``/v2`` and gRPC ``ServerMetadata`` (listed where a registry serves)."""

SHM_ROOT = "/dev/shm"
"""Where Linux keeps POSIX shared-memory objects (``shm_open(3)``: glibc maps ``/name`` there)."""

DEFAULT_MAX_REGIONS = 1024
"""Most regions registered at once (each holds one mapping and one file descriptor)."""

SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
"""The tensor parameters of the extension (Triton's names)."""

_KEY = re.compile(r"/?[A-Za-z0-9._-]{1,200}")
_MAX_NAME_CHARS = 1024
_PAGE = mmap.ALLOCATIONGRANULARITY
_LE: dict[DataType, np.dtype[Any]] = {}

_OWN_INODES: set[tuple[int, int]] = set()
_OWN_LOCK = threading.Lock()


def _inode(name: str, root: str) -> tuple[int, int] | None:
    try:
        info = os.stat(os.path.join(root, name.removeprefix("/")), follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def mark_own(name: str, *, root: str = SHM_ROOT) -> None:
    """Record the POSIX shared-memory object ``name`` (``/name`` or ``name``) as one of this
    process's own (created or attached by frameserve): it can never be registered as a client
    region, whatever name it is given later. An object that is gone already is ignored."""
    inode = _inode(name, root)
    if inode is not None:
        with _OWN_LOCK:
            _OWN_INODES.add(inode)


def forget_own(name: str, *, root: str = SHM_ROOT) -> None:
    """Undo :func:`mark_own` before the object ``name`` is unlinked (its inode may be reused)."""
    inode = _inode(name, root)
    if inode is not None:
        with _OWN_LOCK:
            _OWN_INODES.discard(inode)


def _is_own(info: os.stat_result) -> bool:
    with _OWN_LOCK:
        return (info.st_dev, info.st_ino) in _OWN_INODES


def client_shm_disabled() -> SharedMemoryUnsupportedError:
    """The error every use of client shared memory gets on a server not started with it."""
    return SharedMemoryUnsupportedError(
        "client shared memory is disabled on this server; start it with --allow-client-shm to register "
        "and use system shared-memory regions"
    )


def cuda_shm_unsupported(name: str) -> SharedMemoryUnsupportedError:
    """The error of a CUDA shared-memory registration (frameserve maps no CUDA IPC handles)."""
    return SharedMemoryUnsupportedError(
        f"failed to register CUDA shared memory region {shown(name)}: CUDA shared memory is not supported by "
        "frameserve; use system shared memory"
    )


@dataclass(frozen=True, slots=True)
class ShmLocation:
    """Where one tensor lies: ``byte_size`` bytes at ``offset`` bytes into the region ``region``."""

    region: str
    byte_size: int
    offset: int = 0


def shm_location(params: Mapping[str, Any], where: str) -> ShmLocation | None:
    """A tensor's shared-memory parameters (:data:`SHM_PARAMETERS`), or ``None`` when it has none.

    Args:
        params: the tensor's parameters as plain values (HTTP's JSON object; gRPC's
            ``InferParameter`` values).
        where: what the tensor is, for messages (``"input 'a'"``).

    Raises:
        SharedMemoryError: a region name that is not a string, an offset or byte size that is
            not a non-negative integer, ``shared_memory_byte_size`` missing, or an offset or byte
            size without a region (Triton's rules).
    """
    if not params or not any(k in params for k in SHM_PARAMETERS):
        return None
    region = params.get("shared_memory_region")
    if region is None:
        raise SharedMemoryError(
            f"{where}: 'shared_memory_offset' and 'shared_memory_byte_size' need a 'shared_memory_region' parameter"
        )
    if not isinstance(region, str) or not region:
        raise SharedMemoryError(f"{where}: 'shared_memory_region' must be a non-empty string")
    if "shared_memory_byte_size" not in params:
        raise SharedMemoryError(f"{where}: 'shared_memory_region' needs a 'shared_memory_byte_size' parameter")
    return ShmLocation(
        region,
        _non_negative(params["shared_memory_byte_size"], "shared_memory_byte_size", where),
        _non_negative(params.get("shared_memory_offset", 0), "shared_memory_offset", where),
    )


def _non_negative(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SharedMemoryError(f"{where}: {shown(key)} must be a non-negative integer, got {shown(value)}")
    return value


class _Region:
    """One registered region: its mapping and how many requests use it."""

    __slots__ = ("base", "byte_size", "key", "mm", "name", "offset", "retired", "tenant", "users")

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, mm: mmap.mmap, base: int, tenant: str = ""
    ) -> None:
        self.tenant = tenant
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.mm: mmap.mmap | None = mm
        self.base = base  # where the region starts in the mapping (the mapping starts at a page)
        self.users = 0
        self.retired = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def unmap(self) -> None:
        mm, self.mm = self.mm, None
        if mm is None:
            return
        try:
            mm.close()
        except BufferError:  # numpy views of it still live (a model kept an input): unmapped with the last
            pass


class SharedMemoryRegistry:
    """The system shared-memory regions clients registered with this server.

    One per server, given to both transports (a client registers over one connection and infers
    over others, as perf_analyzer does). Thread-safe: every method may be called from any thread.

    Regions are kept per tenant (``tenant``: a token's NAME; ``""`` on a server without tokens);
    ``everyone=True`` (an ``admin`` token) makes status and unregister span every tenant.

    Args:
        root: the folder of POSIX shared-memory objects (default :data:`SHM_ROOT`).
        max_regions: most regions at once, all tenants together (default :data:`DEFAULT_MAX_REGIONS`).
        key_prefix: keys must start with it (``serve --client-shm-prefix``; default
            :data:`DEFAULT_CLIENT_PREFIX`; a leading ``/`` is implied).

    Raises:
        ValueError: ``max_regions`` < 1, or a ``key_prefix`` that is not the start of a shm name.
    """

    def __init__(
        self, *, root: str = SHM_ROOT, max_regions: int = DEFAULT_MAX_REGIONS, key_prefix: str = DEFAULT_CLIENT_PREFIX
    ) -> None:
        if max_regions < 1:
            raise ValueError(f"max_regions must be >= 1, got {max_regions}")
        prefix = "/" + key_prefix.removeprefix("/")
        if prefix != "/" and (not _KEY.fullmatch(prefix) or ".." in prefix):
            raise ValueError(
                f"--client-shm-prefix must be '/' or the start of a POSIX shm name ('/' then letters, "
                f"digits, '.', '_', '-'), got {key_prefix!r}"
            )
        self.root = root
        self.max_regions = max_regions
        self.key_prefix = prefix
        self._lock = threading.Lock()
        self._regions: dict[tuple[str, str], _Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int, *, tenant: str = "") -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key`` as region ``name``.

        Args:
            name: the region's name (what tensors' ``shared_memory_region`` will say), unique
                within ``tenant``.
            key: the object's POSIX shm name (``/name`` or ``name``).
            offset, byte_size: where the region lies in the object, in bytes (``byte_size`` > 0).
            tenant: who registers it.

        Raises:
            SharedMemoryExistsError: ``name`` is registered by ``tenant`` already.
            SharedMemoryError: a bad name, a key that is not one shm name, is not under
                :attr:`key_prefix`, names one of the server's own objects, does not exist, is not
                a regular file or cannot be opened for reading and writing; ``offset +
                byte_size`` past the object's end.
            ResourceExhaustedError: :attr:`max_regions` are registered, or no file descriptor is left.
        """
        if not isinstance(name, str) or not name:
            raise SharedMemoryError("'region name' is necessary to register a system shared memory region")
        if len(name) > _MAX_NAME_CHARS or not name.isprintable():
            raise SharedMemoryError(f"a region name is at most {_MAX_NAME_CHARS} printable characters")
        file_name = self._file_name(name, key, self.key_prefix)
        for value, what in ((offset, "offset"), (byte_size, "byte_size")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SharedMemoryError(
                    f"failed to register shared memory region {shown(name)}: {what} must be a non-negative integer"
                )
        if byte_size == 0:
            raise SharedMemoryError(f"failed to register shared memory region {shown(name)}: byte_size must be > 0")
        with self._lock:
            self._check_free(tenant, name)
        mm, base = self._map(name, key, file_name, offset, byte_size)
        region = _Region(name, key, offset, byte_size, mm, base, tenant)
        with self._lock:
            try:
                self._check_free(tenant, name)
            except BaseException:
                region.unmap()
                raise
            self._regions[(tenant, name)] = region

    def _check_free(self, tenant: str, name: str) -> None:
        if (tenant, name) in self._regions:
            raise SharedMemoryExistsError(
                f"shared memory region {shown(name)} is already registered; unregister it first"
            )
        if len(self._regions) >= self.max_regions:
            raise ResourceExhaustedError(
                f"{self.max_regions} shared memory regions are registered, the most this server keeps; unregister some"
            )

    @staticmethod
    def _file_name(name: str, key: Any, prefix: str = "/") -> str:
        if not isinstance(key, str) or not _KEY.fullmatch(key) or ".." in key or key.strip("/") == ".":
            raise SharedMemoryError(
                f"cannot register shared memory region {shown(name)}: the key must be one POSIX shared memory name "
                "('/name' of letters, digits, '.', '_' and '-'; no '..')"
            )
        file_name = key.removeprefix("/")
        if not ("/" + file_name).startswith(prefix):
            raise SharedMemoryError(
                f"cannot register shared memory region {shown(name)}: this server registers only keys starting with "
                f"{prefix!r} (serve --client-shm-prefix), got {shown(key)}"
            )
        if file_name.startswith((OWN_SEGMENT_PREFIX, "sem.")):
            raise SharedMemoryError(
                f"cannot register shared memory region {shown(name)}: keys starting with {OWN_SEGMENT_PREFIX!r} or "
                "'sem.' name the server's own segments and semaphores"
            )
        return file_name

    def _map(self, name: str, key: str, file_name: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(self.root, file_name), flags)
        except FileNotFoundError:
            raise SharedMemoryError(
                f"unable to open shared memory region {shown(name)}: no shared memory object {shown(key)}"
            ) from None
        except OSError as exc:
            raise self._os_error(name, key, exc) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryError(
                    f"unable to open shared memory region {shown(name)}: {shown(key)} is not a shared memory object"
                )
            if info.st_nlink != 1 or _is_own(info):
                raise SharedMemoryError(
                    f"cannot register shared memory region {shown(name)}: {shown(key)} is one of the server's own objects "
                    "(or another name of one)"
                )
            if offset + byte_size > info.st_size:
                raise SharedMemoryError(
                    f"failed to register shared memory region {shown(name)}: offset {offset} + byte_size {byte_size} "
                    f"is past the end of {shown(key)} ({info.st_size} bytes)"
                )
            start = offset - offset % _PAGE
            try:
                mm = mmap.mmap(
                    fd,
                    offset - start + byte_size,
                    flags=mmap.MAP_SHARED,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=start,
                )
            except OSError as exc:
                raise self._os_error(name, key, exc) from None
        finally:
            os.close(fd)  # the mapping keeps its own descriptor
        return mm, offset - start

    @staticmethod
    def _os_error(name: str, key: str, exc: OSError) -> Exception:
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            return ResourceExhaustedError(f"cannot map shared memory region {shown(name)} now: {exc.strerror}")
        if exc.errno == errno.ELOOP:
            return SharedMemoryError(
                f"unable to open shared memory region {shown(name)}: {shown(key)} is a symbolic link"
            )
        return SharedMemoryError(
            f"unable to open shared memory region {shown(name)} ({shown(key)}) for reading and writing: {exc.strerror}"
        )

    def unregister(self, name: str | None = None, *, tenant: str = "", everyone: bool = False) -> None:
        """Drop ``tenant``'s region ``name`` (``None`` or ``""``: every region of ``tenant``;
        ``everyone``: of every tenant). New requests can no longer use it; requests using it now
        keep its mapping until they finish. An unknown name is not an error (Triton's
        behaviour)."""
        with self._lock:
            keys = [k for k in self._regions if (everyone or k[0] == tenant) and (not name or k[1] == name)]
            gone = [self._regions.pop(k) for k in keys]
            idle = []
            for region in gone:
                region.retired = True
                if region.users == 0:
                    idle.append(region)
        for region in idle:
            region.unmap()

    def status(self, name: str | None = None, *, tenant: str = "", everyone: bool = False) -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]`` of ``tenant``'s region ``name`` or
        (``None``/``""``) of every region of ``tenant`` (``everyone``: of every tenant, another
        tenant's with its ``"tenant"`` too), sorted by name.

        Raises:
            SharedMemoryNotFoundError: ``name`` is not registered (by ``tenant``).
        """
        with self._lock:
            found = [
                self._regions[k]
                for k in sorted(self._regions, key=lambda k: (k[1], k[0]))
                if (everyone or k[0] == tenant) and (not name or k[1] == name)
            ]
        if name and not found:
            raise SharedMemoryNotFoundError(f"Unable to find system shared memory region: {shown(name)}")
        # another tenant's (seen by an admin) says whose it is
        return [r.status() if r.tenant == tenant else {**r.status(), "tenant": r.tenant} for r in found]

    def close(self) -> None:
        """Unregister every tenant's regions."""
        self.unregister(None, everyone=True)

    def use(self, tenant: str = "") -> SharedMemoryUse:
        """A new per-request use of ``tenant``'s regions (release it when the request is answered)."""
        return SharedMemoryUse(self, tenant)

    def _acquire(self, location: ShmLocation, where: str, tenant: str = "") -> _Region:
        with self._lock:
            region = self._regions.get((tenant, location.region))
            if region is None:
                raise SharedMemoryNotFoundError(
                    f"{where}: Unable to find shared memory region: {shown(location.region)}"
                )
            if location.offset >= region.byte_size:
                raise SharedMemoryError(
                    f"{where}: Invalid offset {location.offset} for shared memory region {shown(region.name)} "
                    f"({region.byte_size} bytes)"
                )
            if location.offset + location.byte_size > region.byte_size:
                raise SharedMemoryError(
                    f"{where}: Invalid offset + byte size for shared memory region {shown(region.name)}: offset "
                    f"{location.offset} + byte_size {location.byte_size} is past its {region.byte_size} bytes"
                )
            mm = region.mm
            assert mm is not None  # registered regions are mapped
            try:
                size = mm.size()  # the object's size now: reading past its end would be SIGBUS
            except OSError:
                size = -1
            if size < region.offset + region.byte_size:
                raise SharedMemoryError(
                    f"{where}: the shared memory object {shown(region.key)} of region {shown(region.name)} shrank below "
                    f"the registered offset + byte_size ({region.offset + region.byte_size} bytes); register it again"
                )
            region.users += 1
            return region

    def _release(self, region: _Region) -> None:
        with self._lock:
            region.users -= 1
            last = region.retired and region.users == 0
        if last:
            region.unmap()


class SharedMemoryUse:
    """The regions one request uses, held until :meth:`release` (a context manager too).

    The transports make one per request (:meth:`SharedMemoryRegistry.use`), pass it to their
    codec, which reads inputs (:meth:`input`) and notes outputs (:meth:`output`) while
    decoding, then write the outputs (:meth:`write_output`) while encoding, and release it once
    the answer is built, whatever happened.
    """

    __slots__ = ("_held", "_registry", "input_bytes", "outputs", "tenant")

    def __init__(self, registry: SharedMemoryRegistry, tenant: str = "") -> None:
        self._registry = registry
        self.tenant = tenant
        self._held: list[_Region] = []
        self.outputs: dict[str, tuple[_Region, ShmLocation]] = {}
        """Output name -> the region and place it is written to."""
        self.input_bytes = 0
        """Bytes of fixed-size inputs read from regions (views, not heap memory); kept after release."""

    def _acquire(self, location: ShmLocation, where: str) -> _Region:
        region = self._registry._acquire(location, where, self.tenant)
        self._held.append(region)
        return region

    def input(
        self, name: str, datatype: DataType, shape: tuple[int, ...], location: ShmLocation
    ) -> np.ndarray[Any, Any]:
        """Input ``name`` from its region: a read-only zero-copy numpy view for fixed-size
        datatypes (a copy only where the place is not aligned for the dtype, or for BOOL, whose
        bytes are read as ``!= 0``); BYTES elements are split out of the region's bytes.

        Raises:
            SharedMemoryNotFoundError: the region is not registered.
            SharedMemoryError: the place is outside the region (or its object shrank).
            TensorError: ``byte_size`` is not what ``shape`` of ``datatype`` takes, or the BYTES
                data does not hold ``prod(shape)`` elements exactly.
        """
        where = f"input {shown(name)}"
        region = self._acquire(location, where)
        mm = region.mm
        assert mm is not None
        count = math.prod(shape)
        start = region.base + location.offset
        if datatype is DataType.BYTES:  # elements are copied out: the view goes with this call
            raw = memoryview(mm)[start : start + location.byte_size]
            return decode_bytes_elements(raw, count, where=where).reshape(shape)
        dtype = _le(datatype)
        if location.byte_size != count * dtype.itemsize:
            raise TensorError(
                f"{where}: shared_memory_byte_size is {location.byte_size} bytes but shape {list(shape)} of "
                f"{datatype.value} takes {count * dtype.itemsize} bytes"
            )
        if datatype is DataType.BOOL:
            flags: np.ndarray[Any, Any] = np.frombuffer(mm, np.uint8, count, start) != 0
            return flags.reshape(shape)
        array = np.frombuffer(mm, dtype, count, start).reshape(shape)
        if not array.dtype.isnative:  # pragma: no cover - big-endian hosts
            return array.astype(array.dtype.newbyteorder("="))
        if start % dtype.alignment:
            return array.copy()
        array.flags.writeable = False
        self.input_bytes += location.byte_size
        return array

    def output(self, name: str, location: ShmLocation) -> None:
        """Note that output ``name`` goes to ``location`` (its region held until release).

        Raises:
            SharedMemoryNotFoundError: the region is not registered.
            SharedMemoryError: the place is outside the region (or its object shrank).
        """
        self.outputs[name] = (self._acquire(location, f"output {shown(name)}"), location)

    def write_output(self, name: str, array: np.ndarray[Any, Any]) -> None:
        """Write output ``name`` (noted with :meth:`output`) into its place in its wire form.

        Raises:
            SharedMemoryError: the place is smaller than the output (the message gives both sizes).
            TensorError: the array's dtype has no v2 datatype.
        """
        region, location = self.outputs[name]
        mm = region.mm
        assert mm is not None
        datatype = DataType.from_numpy(array.dtype)
        encoded = encode_bytes_elements(array) if datatype is DataType.BYTES else None
        size = len(encoded) if encoded is not None else int(array.size) * _le(datatype).itemsize
        if size > location.byte_size:
            raise SharedMemoryError(
                f"shared memory size specified with the request for output {shown(name)} ({location.byte_size} bytes) "
                f"should be at least {size} bytes to hold the results"
            )
        start = region.base + location.offset
        if encoded is not None:
            mm[start : start + size] = encoded
            return
        target = np.frombuffer(mm, _le(datatype), int(array.size), start).reshape(array.shape)
        np.copyto(target, array.astype(np.uint8) if datatype is DataType.BOOL else array, casting="unsafe")

    def release(self) -> None:
        """Give back every region this request held (idempotent)."""
        held, self._held = self._held, []
        self.outputs = {}
        for region in held:
            self._registry._release(region)

    def __enter__(self) -> SharedMemoryUse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _le(datatype: DataType) -> np.dtype[Any]:
    """The little-endian numpy dtype of a fixed-size datatype (BOOL as ``uint8``)."""
    got = _LE.get(datatype)
    if got is None:
        got = np.dtype(np.uint8) if datatype is DataType.BOOL else datatype.to_numpy().newbyteorder("<")
        _LE[datatype] = got
    return got
