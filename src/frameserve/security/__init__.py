"""Security: bearer tokens and roles (:mod:`frameserve.security.tokens`), who may call which
route and which browser requests are refused (:mod:`frameserve.security.auth`), the address
guard every outbound request a client can cause goes through (job sources, ``/v1/analyze`` URIs,
callbacks: :mod:`frameserve.security.guard`), and credentials kept out of what is shown
(:mod:`frameserve.security.redact`).

A base layer (it imports only :mod:`frameserve.errors`): the protocol layer's HTTP gate and
gRPC interceptor, the job API and the CLI all use it.
"""

from __future__ import annotations

from frameserve.security.auth import cross_site_refusal, grpc_roles, http_roles
from frameserve.security.guard import AddressGuard, GuardedTransport, address_refusal, embedded_ipv4
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits
from frameserve.security.quotas import DEFAULT_QUOTA, ConcurrencyGate, Quotas, RateGate, TenantQuota
from frameserve.security.redact import REDACTED, quiet_http_logs, redact_text, redact_uri
from frameserve.security.tokens import (
    IMPLICIT_OWNER,
    MIN_TOKEN_CHARS,
    ROLES,
    Principal,
    TokenTable,
    bearer_token,
    is_tenant_name,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_QUOTA",
    "IMPLICIT_OWNER",
    "MIN_TOKEN_CHARS",
    "REDACTED",
    "ROLES",
    "AddressGuard",
    "ConcurrencyGate",
    "GuardedTransport",
    "Principal",
    "Quotas",
    "RateGate",
    "TenantQuota",
    "TensorLimits",
    "TokenTable",
    "address_refusal",
    "bearer_token",
    "cross_site_refusal",
    "embedded_ipv4",
    "grpc_roles",
    "http_roles",
    "is_tenant_name",
    "quiet_http_logs",
    "redact_text",
    "redact_uri",
]
