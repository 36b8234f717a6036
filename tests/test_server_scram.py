"""SCRAM-SHA-256 over stored verifiers: the RFC 7677 vector, failures, verifier format."""

from __future__ import annotations

import base64

import pytest

from dpproxy.server.scram import (
    ScramClient,
    ScramError,
    ScramExchange,
    make_verifier,
    mock_verifier,
    parse_verifier,
    saslprep,
    verify_password,
)


def _rfc7677_verifier() -> str:
    return make_verifier("pencil", 4096, base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))


def test_rfc7677_example() -> None:
    exchange = ScramExchange(parse_verifier(_rfc7677_verifier()),
                             nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server_first = exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert server_first == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = exchange.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert exchange.succeeded


def test_verifier_format_is_postgres() -> None:
    verifier = make_verifier("pencil")
    mechanism, params, _ = verifier.split("$")
    assert mechanism == "SCRAM-SHA-256"
    assert params.split(":")[0] == "4096"
    parsed = parse_verifier(verifier)
    assert len(parsed.salt) == 16 and len(parsed.stored_key) == 32
    assert str(parsed) == verifier
    assert make_verifier("pencil") != verifier  # a fresh salt each time
    assert verify_password("pencil", verifier) and not verify_password("Pencil", verifier)


@pytest.mark.parametrize("text", ["md5abc", "SCRAM-SHA-256$4096:c2FsdA==$abc",
                                  "SCRAM-SHA-256$x:c2FsdA==$YQ==:YQ==", "plain password"])
def test_bad_verifiers(text: str) -> None:
    with pytest.raises(ValueError):
        parse_verifier(text)


def _exchange(password: str, verifier: str, *, header: str = "n,,") -> bytes:
    client = ScramClient(password, gs2_header=header)
    server = ScramExchange(parse_verifier(verifier))
    return server.final(client.final(server.first(client.first())))


def test_right_password_succeeds_and_server_proves_itself() -> None:
    verifier = make_verifier("s3cret")
    client = ScramClient("s3cret")
    server = ScramExchange(parse_verifier(verifier))
    assert client.verify(server.final(client.final(server.first(client.first()))))


def test_client_without_channel_binding_support_flag_y_is_accepted() -> None:
    assert _exchange("s3cret", make_verifier("s3cret"), header="y,,").startswith(b"v=")


def test_wrong_password_fails() -> None:
    with pytest.raises(ScramError):
        _exchange("wrong", make_verifier("s3cret"))


def test_mock_verifier_never_succeeds_and_is_stable_per_user() -> None:
    secret = b"k" * 32
    assert mock_verifier("mallory", secret).salt == mock_verifier("mallory", secret).salt
    assert mock_verifier("mallory", secret).salt != mock_verifier("eve", secret).salt
    exchange = ScramExchange(mock_verifier("mallory", secret), valid=False)
    client = ScramClient("anything")
    with pytest.raises(ScramError):
        exchange.final(client.final(exchange.first(client.first())))


@pytest.mark.parametrize("first", [
    b"p=tls-server-end-point,,n=,r=abc",  # channel binding asked for: not offered
    b"n,a=admin,n=,r=abc",  # authorization identity
    b"n,,r=abc", b"garbage", b"n,,n=,r=", b"\xff\xfe",
])
def test_malformed_client_first(first: bytes) -> None:
    with pytest.raises(ScramError):
        ScramExchange(parse_verifier(make_verifier("x"))).first(first)


def test_tampered_final_messages() -> None:
    verifier = parse_verifier(make_verifier("s3cret"))
    client = ScramClient("s3cret")
    server = ScramExchange(verifier)
    final = client.final(server.first(client.first()))
    for bad in (final.replace(b"r=", b"r=x", 1), final[:-4] + b"AAA=", b"c=biws,p=abc",
                final.replace(b"c=biws", b"c=eSws", 1)):
        with pytest.raises(ScramError):
            ScramExchange(verifier).final(bad)  # a fresh exchange: no client-first yet
        fresh = ScramExchange(verifier)
        fresh.first(client.first())
        with pytest.raises(ScramError):
            fresh.final(bad)


def test_saslprep() -> None:
    assert saslprep("pencil") == "pencil"
    assert saslprep("I\u00adX") == "IX"  # soft hyphen maps to nothing
    assert saslprep("\u2168") == "IX"  # NFKC
    assert saslprep("a\u00a0b") == "a b"  # non-ASCII space
    assert saslprep("a\u0007b") == "a\u0007b"  # prohibited: used as is, like PostgreSQL
