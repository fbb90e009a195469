"""``turngym.remote.security`` on its own: the header checks of ``ServeGuard`` (property-tested: any
header bytes get a verdict, never an exception), ``is_loopback``, ``resolve_token``."""

from __future__ import annotations

import base64
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.remote.security import ServeGuard, is_loopback, resolve_token

pytestmark = pytest.mark.reliability

TOKEN = "a-client-token-0123456789"
TRAINER = "a-trainer-token-0123456789"
GUARD = ServeGuard.for_bind("127.0.0.1", 8000, TOKEN, trainer_token=TRAINER)
HOST = "127.0.0.1:8000"


def headers(**values: str | bytes) -> dict[bytes, list[bytes]]:
    return {k.encode(): [v if isinstance(v, bytes) else v.encode()] for k, v in values.items()}


def test_roles_and_refusals():
    assert GUARD.check(headers(host=HOST, authorization=f"Bearer {TOKEN}")) == "client"
    assert GUARD.check(headers(host=HOST, authorization=f"Bearer {TRAINER}")) == "trainer"
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert GUARD.check(headers(host=HOST, authorization=f"Basic {basic}")) == "client"
    for auth in ("", "Bearer", f"Bearer {TOKEN}x", f"Token {TOKEN}", "Basic !!!", f"Basic {TOKEN}"):
        verdict = GUARD.check(headers(host=HOST, authorization=auth))
        assert verdict[:2] == (401, "unauthorized")
    assert GUARD.check(headers(host=HOST), needs_token=False) == "client"
    assert GUARD.check(headers(host="localhost:8000", authorization=f"Bearer {TOKEN}")) == "client"
    assert GUARD.check(headers(host="[::1]:8000", authorization=f"Bearer {TOKEN}")) == "client"
    assert GUARD.check(headers(host="127.0.0.1:8001", authorization=f"Bearer {TOKEN}"))[1] == "forbidden_host"
    assert GUARD.check(headers(host="evil.example:8000"), needs_token=False)[1] == "forbidden_host"
    two_hosts = {b"host": [HOST.encode(), b"evil.example"], b"authorization": [f"Bearer {TOKEN}".encode()]}
    assert GUARD.check(two_hosts)[:2] == (400, "malformed")


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://127.0.0.1:8000/", True),
        ("http://127.0.0.1:8001", False),
        ("https://127.0.0.1:8000", True),  # same host and port: the scheme does not change who it is
        ("http://evil.example", False),
        ("http://evil.example:8000", False),
        ("null", False),
        ("file://", False),
        ("http://127.0.0.1:99999", False),
        ("http://[::1", False),
        ("http://user@127.0.0.1:8000", False),
        ("", False),
    ],
)
def test_origin_must_be_the_same_as_the_host(origin, ok):
    verdict = GUARD.check(headers(host=HOST, origin=origin, authorization=f"Bearer {TOKEN}"))
    assert (verdict == "client") is ok, verdict
    extra = ServeGuard.for_bind("127.0.0.1", 8000, TOKEN, allowed_origins=["http://tool.example"])
    assert (
        extra.check(headers(host=HOST, origin="http://tool.example", authorization=f"Bearer {TOKEN}"))
        == "client"
    )


def test_wildcard_binds_accept_any_host_but_still_need_the_token():
    guard = ServeGuard.for_bind("0.0.0.0", 8000, TOKEN)
    assert guard.check(headers(host="gpu-box:8000", authorization=f"Bearer {TOKEN}")) == "client"
    assert guard.check(headers(host="gpu-box:8000"))[0] == 401
    named = ServeGuard.for_bind("10.1.2.3", 8000, TOKEN, extra_hosts=["gpu-box"])
    assert named.check(headers(host="gpu-box:8000", authorization=f"Bearer {TOKEN}")) == "client"
    assert named.check(headers(host="10.1.2.3:8000", authorization=f"Bearer {TOKEN}")) == "client"
    assert named.check(headers(host="other:8000", authorization=f"Bearer {TOKEN}"))[1] == "forbidden_host"


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from([b"host", b"origin", b"authorization", b"content-length", b"x"]),
        st.lists(
            st.binary(max_size=60)
            | st.builds(
                lambda a, b: f"{a}://{b}".encode(),
                st.sampled_from(["http", "https", "x"]),
                st.text(max_size=30),
            ),
            min_size=1,
            max_size=2,
        ),
    ),
    st.booleans(),
)
def test_any_headers_get_a_verdict_never_an_exception(raw, needs_token):
    verdict = GUARD.check(raw, needs_token=needs_token)
    assert verdict in ("client", "trainer") or verdict[0] in (400, 401, 403)
    if verdict in ("client", "trainer"):  # only ever with a host the server answers to
        assert raw[b"host"][0].decode("latin-1").lower() in GUARD.allowed_hosts


@given(st.ip_addresses())
def test_is_loopback_is_the_loopback_range(address):
    mapped = getattr(address, "ipv4_mapped", None)
    expected = address.is_loopback or (mapped is not None and mapped.is_loopback)
    assert is_loopback(str(address)) is expected
    if address.version == 6:
        assert is_loopback(f"[{address}]") is expected


def test_is_loopback_names():
    assert is_loopback("localhost") and is_loopback("LOCALHOST") and is_loopback("127.8.9.10")
    for host in ("0.0.0.0", "::", "", "example.com", "localhost.example.com", "127.0.0.1.nip.io"):
        assert not is_loopback(host), host
    assert ipaddress.ip_address("127.255.255.254").is_loopback


def test_resolve_token(monkeypatch):
    monkeypatch.delenv("T_ENV", raising=False)
    token, generated = resolve_token(None, env_var="T_ENV", insecure_no_token=False, host="0.0.0.0")
    assert generated and len(token) >= 40
    assert resolve_token(TOKEN, env_var="T_ENV", insecure_no_token=False, host="h") == (TOKEN, False)
    monkeypatch.setenv("T_ENV", TRAINER)
    assert resolve_token(None, env_var="T_ENV", insecure_no_token=False, host="h") == (TRAINER, False)
    assert resolve_token(None, env_var="T_ENV", insecure_no_token=True, host="::1") == (None, False)
    with pytest.raises(ValueError, match="loopback"):
        resolve_token(None, env_var="T_ENV", insecure_no_token=True, host="0.0.0.0")
    with pytest.raises(ValueError, match="choose one"):
        resolve_token(TOKEN, env_var="T_ENV", insecure_no_token=True, host="127.0.0.1")
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token("short", env_var="T_ENV", insecure_no_token=False, host="127.0.0.1")
    with pytest.raises(ValueError, match="printable"):
        resolve_token("a token with spaces in it", env_var="T_ENV", insecure_no_token=False, host="h")
    with pytest.raises(ValueError, match="differ"):
        ServeGuard.for_bind("127.0.0.1", 1, TOKEN, trainer_token=TOKEN)


@pytest.mark.parametrize(
    ("name", "annotation", "why"),
    [
        ("depth", int, None),
        ("world_seed", int, None),
        ("split", "Literal", None),
        ("system_prompt", str, None),
        ("hops", "list[int] | None", None),
        ("servers", "Any", "a command"),
        ("snapshot", "str | None", "a path"),
        ("cache_dir", "str | None", "a path"),
        ("retriever", "str | None", "a URL or host"),
        ("base_image", "str | None", "an image or package"),
        ("pool_warm", int, "a resource limit or size"),
        ("max_output_chars", int, "a resource limit or size"),
        ("n_passages", int, "a resource limit or size"),
        ("command_timeout", float, "a resource limit or size"),
        ("judge", "Any", "a code object"),
        ("corpus_file", "Path", "a path"),
        ("_session", "Any", "not a plain argument name"),
        ("task", "os.PathLike", "not plain JSON"),
        ("task", "Callable", "not plain JSON"),
    ],
)
def test_never_settable_names_and_types(name, annotation, why):
    import os
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, Literal

    from turngym.remote.env_args import never_settable

    types = {
        "Literal": Literal["a", "b"],
        "list[int] | None": list[int] | None,
        "Any": Any,
        "str | None": str | None,
        "Path": Path,
        "os.PathLike": str | os.PathLike,
        "Callable": Callable[[], int],
    }
    found = never_settable(name, types.get(annotation, annotation))
    assert (found is None) if why is None else (found is not None and why in found), found
