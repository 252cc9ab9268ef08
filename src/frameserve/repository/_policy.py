"""Which version folders of a model are served: Triton's ``ModelVersionPolicy``.

Source: ``ModelVersionPolicy`` in triton-inference-server/common ``protobuf/model_config.proto``.
In config.yaml it is one of::

    version_policy: {latest: {num_versions: 2}}   # the N highest versions (default N = 1)
    version_policy: {all: {}}                     # every version folder
    version_policy: {specific: {versions: [1, 3]}}  # these versions, where their folder exists
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from frameserve.errors import ModelConfigError

__all__ = ["VersionPolicy"]

PolicyKind = Literal["latest", "all", "specific"]


@dataclass(frozen=True)
class VersionPolicy:
    """A version policy.

    Attributes:
        kind: ``"latest"`` (the ``num_versions`` highest), ``"all"`` or ``"specific"``.
        num_versions: how many of the highest versions ``latest`` serves (>= 1).
        versions: the version numbers ``specific`` serves (non-empty for ``specific``).
    """

    kind: PolicyKind = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ModelConfigError(f"version policy {self.kind!r} unknown; supported values are latest, all, specific")
        if self.kind == "latest" and self.num_versions < 1:
            raise ModelConfigError(f"version_policy.latest.num_versions must be >= 1, got {self.num_versions}")
        if self.kind == "specific" and not self.versions:
            raise ModelConfigError("version_policy.specific.versions must list at least one version")
        object.__setattr__(self, "versions", tuple(sorted({int(v) for v in self.versions})))

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions served out of the ``available`` version folders, ascending.

        ``specific`` versions without a folder are left out (the caller reports an empty result).
        """
        present = sorted(set(available))
        if self.kind == "all":
            return present
        if self.kind == "specific":
            return [v for v in present if v in self.versions]
        return present[-self.num_versions :]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> VersionPolicy:
        """Parse the config form (``{"latest": {"num_versions": N}}`` ...); ``None``/``{}`` = latest 1."""
        if not data:
            return cls()
        if len(data) != 1:
            raise ModelConfigError(f"version_policy must have exactly one of latest, all, specific; got {sorted(data)}")
        ((kind, body),) = data.items()
        body = body or {}
        if kind == "latest":
            return cls("latest", num_versions=int(body.get("num_versions", 1)))
        if kind == "all":
            return cls("all")
        if kind == "specific":
            return cls("specific", versions=tuple(int(v) for v in body.get("versions", ())))
        raise ModelConfigError(f"version policy {kind!r} unknown; supported values are latest, all, specific")

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form of this policy."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.num_versions}}
