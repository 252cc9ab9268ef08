"""The address guard's rule (every address form that reaches a non-public host is refused, public
ones pass), URL checks with the resolver the connection uses, and credential redaction."""

from __future__ import annotations

import ipaddress
import logging

import pytest

from frameserve.errors import AddressRefusedError, InvalidInputError
from frameserve.security import (
    REDACTED,
    AddressGuard,
    address_refusal,
    embedded_ipv4,
    quiet_http_logs,
    redact_text,
    redact_uri,
)

pytestmark = pytest.mark.unit

# Spellings of non-public hosts an attacker tries: each must be refused. Numeric odd forms are
# resolved by getaddrinfo (inet_aton) exactly as the connection would resolve them.
NON_PUBLIC_HOSTS = [
    "127.0.0.1",
    "localhost",
    "LOCALHOST",
    "127.1",
    "0x7f.1",
    "0x7f000001",
    "2130706433",
    "0177.0.0.1",
    "017700000001",
    "0x7f.0x0.0x0.0x1",
    "127.000.000.001",
    "0177.1",
    "0",
    "0.0.0.0",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "169.254.169.254",
    "[fe80::1]",
    "[::ffff:169.254.169.254]",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.0.1",
    "[fc00::1]",
    "[fd12:3456::1]",
    "100.64.0.1",
    "224.0.0.1",
    "[ff02::1]",
    "240.0.0.1",
    "255.255.255.255",
    "198.18.0.1",
    "192.0.0.8",
    "[2002:7f00:1::]",
    "[2002:a9fe:a9fe::]",
    "[64:ff9b::7f00:1]",
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
    "[2001:db8::1]",
]


@pytest.mark.parametrize("host", NON_PUBLIC_HOSTS)
def test_every_spelling_of_a_non_public_host_is_refused(host: str) -> None:
    guard = AddressGuard(what="source", flag="--sources-allow-private")
    with pytest.raises(AddressRefusedError, match=r"non-public address .*--sources-allow-private"):
        guard.check_url(f"http://{host}:8080/video.mp4")
    assert guard.check_url.__self__ is guard  # the same guard object is reusable
    assert AddressGuard(allow_private=True).check_url(f"http://{host}:8080/video.mp4")  # trusted setups


def test_enough_encodings_are_covered() -> None:
    assert len(NON_PUBLIC_HOSTS) >= 20


@pytest.mark.parametrize(
    "addr",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"],
)
def test_public_addresses_pass(addr: str) -> None:
    assert address_refusal(ipaddress.ip_address(addr)) is None


def test_embedded_ipv4_forms() -> None:
    v6 = ipaddress.IPv6Address
    assert embedded_ipv4(v6("::ffff:127.0.0.1")) == ipaddress.IPv4Address("127.0.0.1")
    assert embedded_ipv4(v6("2002:7f00:1::")) == ipaddress.IPv4Address("127.0.0.1")
    assert embedded_ipv4(v6("64:ff9b::a9fe:a9fe")) == ipaddress.IPv4Address("169.254.169.254")
    assert embedded_ipv4(v6("::10.0.0.1")) == ipaddress.IPv4Address("10.0.0.1")
    assert embedded_ipv4(v6("::1")) is None and embedded_ipv4(v6("2606:4700::1111")) is None
    why = address_refusal(v6("::ffff:10.1.2.3"))
    assert why is not None and "private" in why and "10.1.2.3" in why


def test_any_non_public_answer_refuses_the_name() -> None:
    answers = {"mixed.test": ["93.184.216.34", "10.0.0.7"], "public.test": ["93.184.216.34", "2606:4700::1111"]}
    guard = AddressGuard(
        resolver=lambda host, port: answers[host], what="callback_url", flag="--callbacks-allow-private"
    )
    assert guard.check_url("https://public.test/hook") == ["93.184.216.34", "2606:4700::1111"]
    with pytest.raises(
        AddressRefusedError, match=r"'https://mixed.test/hook' resolves to non-public address 10.0.0.7 \(private\)"
    ):
        guard.check_url("https://mixed.test/hook")


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "file:///etc/passwd", "http:///nohost", "gopher://h/", "not a url"]
)
def test_only_http_urls_with_a_host(url: str) -> None:
    with pytest.raises(InvalidInputError, match="must be an http:// or https:// URL with a host"):
        AddressGuard(allow_private=True).check_url(url)


def test_a_name_that_does_not_resolve_is_refused() -> None:
    with pytest.raises(AddressRefusedError, match="does not resolve"):
        AddressGuard().check_url("http://no-such-host.invalid/x")


def test_redaction_hides_credentials_and_keeps_the_rest() -> None:
    uri = (
        "https://user:hunter2@bucket.s3.amazonaws.com/v.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIA123%2F20260101&X-Amz-Signature=deadbeef&token=t0k&sig=s1g&password=pw&keep=1#key=k3y"
    )
    shown = redact_uri(uri)
    for secret in ("hunter2", "user:", "AKIA123", "deadbeef", "t0k", "s1g", "=pw", "k3y"):
        assert secret not in shown, (secret, shown)
    assert shown.startswith("https://***@bucket.s3.amazonaws.com/v.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256&")
    assert "keep=REDACTED" in shown and "X-Amz-Signature=REDACTED" in shown
    plain = "file:///data/in/v.mp4"
    assert redact_uri(plain) is plain
    assert redact_text(f"source {uri!r}: HTTP 404") == f"source {shown!r}: HTTP 404"
    assert redact_uri("http://[::1") == "<unparseable URI>"


@pytest.mark.parametrize(
    "uri",
    [
        "https://cdn.test/v.mp4?jwt=eyJhbGciOiJIUzI1NiJ9.e30.c2VjcmV0",
        "https://cdn.test/v.mp4?sign=c2VjcmV0&t=10",
        "https://cdn.test/v.mp4?md5=c2VjcmV0&expires=1700000000",
        "https://cdn.test/v.mp4?hdnts=exp=1700000000~acl=/*~hmac=c2VjcmV0",
        "https://cdn.test/hls/v.mp4;token=c2VjcmV0;width=640/seg.ts",
        "https://cdn.test/v.mp4?Policy=c2VjcmV0&Signature=x&Key-Pair-Id=APKA",
        "https://cdn.test/v.mp4?c2VjcmV0",
        "https://cdn.test/v.mp4#access_token=c2VjcmV0",
    ],
)
def test_redaction_is_an_allow_list(uri: str) -> None:
    """Every parameter value but a few harmless names is redacted, whatever the secret is called."""
    shown = redact_uri(uri)
    assert "c2VjcmV0" not in shown, shown
    assert shown.startswith("https://cdn.test/") and REDACTED in shown
    assert redact_uri("https://cdn.test/v.mp4?width=640&format=mp4") == "https://cdn.test/v.mp4?width=640&format=mp4"
    assert ";width=640" in redact_uri("https://cdn.test/a;width=640;token=x/b") and "token=REDACTED" in redact_uri(
        "https://cdn.test/a;width=640;token=x/b"
    )


def test_quiet_http_logs_keeps_request_urls_out_of_info_logs() -> None:
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    quiet_http_logs()
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpcore").isEnabledFor(logging.INFO)
