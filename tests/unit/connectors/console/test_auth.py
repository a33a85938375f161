"""Who a request is, what each role may do, and how the tokens setting is read.

Sessions, the login throttle and the app's other hardening: test_sessions.py.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from connectors.console.app import build_app
from connectors.console.auth import authenticate, bearer_token, cookie_name
from connectors.console.settings import (
    ConsoleSettings,
    Operator,
    Role,
    parse_tokens,
    token_digest,
)

ALICE = "alice-token-0123456789abcdef0123456789"
VICTOR = "victor-token-0123456789abcdef0123456789"
OPERATORS = {
    token_digest(ALICE): Operator("alice", Role.OPERATOR),
    token_digest(VICTOR): Operator("victor", Role.VIEWER),
}
COOKIE = cookie_name(secure=False)  # the tests' console is bound to 127.0.0.1
TOKENS_JSON = json.dumps(
    {
        ALICE: {"operator": "alice", "role": "operator"},
        VICTOR: {"operator": "victor", "role": "viewer"},
    }
)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (f"Bearer {ALICE}", ALICE),
        (f"bearer   {ALICE} ", ALICE),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_a_known_token_is_its_operator() -> None:
    assert authenticate(OPERATORS, ALICE) == Operator("alice", Role.OPERATOR)
    assert authenticate(OPERATORS, VICTOR) == Operator("victor", Role.VIEWER)


@pytest.mark.parametrize(
    # The last two: header bytes aiohttp decodes with surrogates, and a non-ASCII value.
    "cookie",
    [None, "", "nope", ALICE[:-1], ALICE + "x", ALICE.upper(), "\udcff" + ALICE, ALICE + "é"],
)
def test_anything_else_is_nobody(cookie: str | None) -> None:
    assert authenticate(OPERATORS, cookie) is None


def test_roles() -> None:
    assert not Role.VIEWER.can_act and not Role.VIEWER.sees_text
    assert Role.OPERATOR.can_act and not Role.OPERATOR.sees_text
    assert Role.ADMIN.can_act and Role.ADMIN.sees_text


def test_tokens_are_parsed_and_names_trimmed() -> None:
    raw = json.dumps({ALICE: {"operator": " alice ", "role": "ADMIN"}})
    assert parse_tokens(raw) == {token_digest(ALICE): Operator("alice", Role.ADMIN)}


def test_a_token_may_be_configured_as_its_sha256() -> None:
    hashed = "sha256:" + hashlib.sha256(ALICE.encode()).hexdigest().upper()
    operators = parse_tokens(json.dumps({hashed: {"operator": "alice", "role": "admin"}}))
    assert authenticate(operators, ALICE) == Operator("alice", Role.ADMIN)
    assert authenticate(operators, hashed) is None  # the hash is not the token


def test_a_token_of_16_characters_is_too_short_now() -> None:
    with pytest.raises(ValueError, match="at least 32"):
        parse_tokens(json.dumps({"a" * 31: {"operator": "a", "role": "viewer"}}))
    assert parse_tokens(json.dumps({"a" * 32: {"operator": "a", "role": "viewer"}}))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ("{}", "must be a JSON object"),
        (json.dumps({"short": {"operator": "a", "role": "viewer"}}), "at least 32"),
        (json.dumps({"sha256:abc": {"operator": "a", "role": "viewer"}}), "64 hexadecimal"),
        (json.dumps({"x" * 40 + "\n": {"operator": "a", "role": "viewer"}}), "printable"),
        (
            json.dumps(
                {
                    ALICE: {"operator": "a", "role": "viewer"},
                    "sha256:" + hashlib.sha256(ALICE.encode()).hexdigest(): {
                        "operator": "b",
                        "role": "admin",
                    },
                }
            ),
            "the same token",
        ),
        (json.dumps({ALICE: {"role": "viewer"}}), "operator (a name) is required"),
        (json.dumps({ALICE: {"operator": "a", "role": "root"}}), "role must be one of"),
        (json.dumps({ALICE: "viewer"}), "must be"),
    ],
)
def test_bad_tokens_are_refused_without_quoting_them(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as exc:
        parse_tokens(raw)
    assert ALICE not in str(exc.value) and "short" not in str(exc.value)


def test_settings_read_the_environment_and_keep_the_tokens_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_TOKENS", TOKENS_JSON)
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_PORT", "7000")
    settings = ConsoleSettings()
    assert settings.port == 7000 and settings.bind_local and settings.lag_url == ""
    assert settings.operators() == OPERATORS
    assert ALICE not in repr(settings)
    assert settings.session_idle_s == 1800 and settings.session_max_s == 12 * 3600
    assert not settings.cookie_secure  # bound to 127.0.0.1: plain HTTP


def test_a_console_listening_beyond_loopback_sends_a_secure_host_cookie(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_TOKENS", TOKENS_JSON)
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_BIND_LOCAL", "false")
    assert ConsoleSettings().cookie_secure
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_SECURE_COOKIE", "false")
    assert not ConsoleSettings().cookie_secure
    assert cookie_name(True) == "__Host-zapstream_session"


def test_a_short_token_refuses_the_start_in_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from connectors.startup import startup_failure_lines

    short = "short-token-0123456789"  # 22 characters: accepted before
    monkeypatch.setenv(
        "ZAPSTREAM_CONSOLE_TOKENS", json.dumps({short: {"operator": "a", "role": "viewer"}})
    )
    with pytest.raises(ValidationError) as exc:
        ConsoleSettings()
    lines = startup_failure_lines(exc.value, {})
    assert len(lines) == 1 and lines[0].startswith("ZAPSTREAM_CONSOLE_TOKENS: ")
    assert "at least 32" in lines[0] and short not in lines[0]


def test_settings_without_tokens_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZAPSTREAM_CONSOLE_TOKENS", raising=False)
    with pytest.raises(ValidationError, match="no operator could log in"):
        ConsoleSettings()


def test_console_variables_are_known_to_the_unknown_variable_check() -> None:
    from connectors.cli import build_parser
    from connectors.startup import unknown_env_lines

    build_parser()
    env = {
        "ZAPSTREAM_CONSOLE_TOKENS": "{}",
        "ZAPSTREAM_CONSOLE_LAG_URL": "",
        "ZAPSTREAM_CONSOLE_PROT": "1",
    }
    assert unknown_env_lines(env) == [
        "ZAPSTREAM_CONSOLE_PROT: unknown variable, no zapstream setting reads it "
        "(did you mean ZAPSTREAM_CONSOLE_PORT?)"
    ]


# --- the app's decisions, before any database call --------------------------------------------


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch) -> TestClient:  # type: ignore[type-arg]
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_TOKENS", TOKENS_JSON)
    # Nothing listens here: a handler that reached the database would answer 503.
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    test_client = TestClient(TestServer(build_app(ConsoleSettings())))
    await test_client.start_server()
    yield test_client
    await test_client.close()


async def test_without_a_token_every_page_is_401(client: TestClient) -> None:  # type: ignore[type-arg]
    for path in ("/", "/jobs", "/jobs/1", "/lag"):
        response = await client.get(path, allow_redirects=False)
        assert response.status == 401, path
        assert 'name="token"' in await response.text()
    assert (await client.post("/jobs/1/cancel", data={"reason": "x"})).status == 401


async def test_a_wrong_token_at_login_is_401_and_sets_no_cookie(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.post("/login", data={"token": "guess-guess-guess-guess"})
    assert response.status == 401 and COOKIE not in response.cookies


async def test_login_sets_an_http_only_strict_cookie(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.post("/login", data={"token": ALICE}, allow_redirects=False)
    assert response.status == 303 and response.headers["Location"] == "/jobs"
    cookie = response.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"


@pytest.mark.parametrize("path", ["/jobs/1/cancel", "/jobs/1/reprocess", "/jobs/bulk"])
async def test_a_viewer_cannot_act(client: TestClient, path: str) -> None:  # type: ignore[type-arg]
    response = await client.post(
        path, data={"reason": "x"}, headers={"Authorization": f"Bearer {VICTOR}"}
    )
    assert response.status == 403
    assert "viewers cannot" in await response.text()


async def test_a_cross_site_post_is_refused(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.post(
        "/jobs/1/cancel",
        data={"reason": "x"},
        headers={"Authorization": f"Bearer {ALICE}", "Origin": "https://evil.example"},
    )
    assert response.status == 403


async def test_an_operator_reaches_the_database(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.get("/jobs", headers={"Authorization": f"Bearer {ALICE}"})
    assert response.status == 503  # authorised; the database is unreachable on purpose


def test_a_lag_url_must_be_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_TOKENS", TOKENS_JSON)
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_LAG_URL", "127.0.0.1:6068/metrics")
    with pytest.raises(ValidationError, match="http"):
        ConsoleSettings()
