"""SCRAM-SHA-256 (RFC 5802, RFC 7677), server side, over stored verifiers.

A verifier is PostgreSQL's format, `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`
(base64 fields): it lets the server check a proof without ever knowing the
password. Channel binding is not offered, so clients send the `n,,` or `y,,`
GS2 header.

>>> verifier = make_verifier("secret", iterations=4096, salt=b"0123456789abcdef")
>>> verifier.startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
True
>>> client = ScramClient("secret")
>>> server = ScramExchange(parse_verifier(verifier))
>>> final = server.final(client.final(server.first(client.first())))
>>> client.verify(final), server.succeeded
(True, True)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096
NONCE_BYTES = 18


class ScramError(Exception):
    """The client's SCRAM messages are malformed or its proof is wrong."""


@dataclass(frozen=True)
class Verifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        b64 = base64.b64encode
        return (f"{MECHANISM}${self.iterations}:{b64(self.salt).decode()}$"
                f"{b64(self.stored_key).decode()}:{b64(self.server_key).decode()}")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def saslprep(password: str) -> str:
    """RFC 4013 SASLprep, as PostgreSQL applies it; a password it rejects is used as is
    (that is what PostgreSQL and libpq do, so both sides agree)."""
    if password.isascii():
        return password
    mapped = "".join(" " if stringprep.in_table_c12(c) else c for c in password
                     if not stringprep.in_table_b1(c))
    normal = unicodedata.normalize("NFKC", mapped)
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
                  stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6,
                  stringprep.in_table_c7, stringprep.in_table_c8, stringprep.in_table_c9)
    if any(check(c) for c in normal for check in prohibited):
        return password
    if any(stringprep.in_table_d1(c) for c in normal) and (
            not (stringprep.in_table_d1(normal[0]) and stringprep.in_table_d1(normal[-1]))
            or any(stringprep.in_table_d2(c) for c in normal)):
        return password  # bidirectional text that RFC 3454 section 6 forbids
    return normal


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt, iterations)


def make_verifier(password: str, iterations: int = DEFAULT_ITERATIONS,
                  salt: bytes | None = None) -> str:
    """A stored verifier for `password` with a fresh random salt."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = salted_password(password, salt, iterations)
    stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    server_key = _hmac(salted, b"Server Key")
    return str(Verifier(iterations, salt, stored_key, server_key))


def parse_verifier(text: str) -> Verifier:
    """Parse PostgreSQL's verifier format; ValueError when it is not one."""
    try:
        mechanism, params, keys = text.split("$")
        iterations_text, salt_text = params.split(":")
        stored_text, server_text = keys.split(":")
        verifier = Verifier(int(iterations_text), base64.b64decode(salt_text, validate=True),
                            base64.b64decode(stored_text, validate=True),
                            base64.b64decode(server_text, validate=True))
    except ValueError:
        raise ValueError("not a SCRAM-SHA-256 verifier") from None
    if mechanism != MECHANISM or verifier.iterations < 1 or len(verifier.stored_key) != 32 \
            or len(verifier.server_key) != 32:
        raise ValueError("not a SCRAM-SHA-256 verifier")
    return verifier


def verify_password(password: str, verifier: str) -> bool:
    """Whether `password` matches the stored verifier (used to print the demo password)."""
    v = parse_verifier(verifier)
    salted = salted_password(password, v.salt, v.iterations)
    return hmac.compare_digest(hashlib.sha256(_hmac(salted, b"Client Key")).digest(),
                               v.stored_key)


def mock_verifier(user: str, server_secret: bytes) -> Verifier:
    """A verifier no password matches, stable per user name: an unknown user sees the same
    exchange (salt, iterations) as a known one, so the reply does not tell them apart."""
    salt = _hmac(server_secret, user.encode("utf-8"))[:16]
    return Verifier(DEFAULT_ITERATIONS, salt, secrets.token_bytes(32), secrets.token_bytes(32))


def _attributes(message: str) -> list[tuple[str, str]]:
    items = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("malformed SCRAM message")
        items.append((part[0], part[2:]))
    return items


class ScramExchange:
    """One server-side exchange: `first(client-first)` → server-first,
    `final(client-final)` → server-final. `succeeded` tells whether the proof matched;
    with a mock verifier it never does."""

    def __init__(self, verifier: Verifier, *, valid: bool = True,
                 nonce: str | None = None) -> None:
        self._verifier = verifier
        self._server_nonce = nonce  # tests only: RFC 7677's fixed nonce
        self._valid = valid
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""
        self.succeeded = False

    def first(self, client_first: bytes) -> bytes:
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-first-message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed client-first-message")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            raise ScramError("channel binding is not supported by this server")
        if cbind not in ("n", "y"):
            raise ScramError("malformed GS2 header")
        if authzid:
            raise ScramError("authorization identities are not supported")
        attributes = _attributes(bare)
        if not attributes or attributes[0][0] != "n" or len(attributes) < 2 \
                or attributes[1][0] != "r":
            raise ScramError("malformed client-first-message")
        if any(key == "m" for key, _ in attributes):
            raise ScramError("mandatory SCRAM extensions are not supported")
        client_nonce = attributes[1][1]
        if not client_nonce or not client_nonce.isprintable() or "," in client_nonce:
            raise ScramError("invalid client nonce")
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + (self._server_nonce or base64.b64encode(
            secrets.token_bytes(NONCE_BYTES)).decode("ascii"))
        salt = base64.b64encode(self._verifier.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={self._verifier.iterations}"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Check the proof; returns server-final on success, raises ScramError otherwise."""
        if not self._server_first:
            raise ScramError("client-final-message before client-first-message")
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-final-message is not UTF-8") from None
        attributes = _attributes(text)
        if len(attributes) < 3 or attributes[0][0] != "c" or attributes[1][0] != "r" \
                or attributes[-1][0] != "p":
            raise ScramError("malformed client-final-message")
        try:
            binding = base64.b64decode(attributes[0][1], validate=True)
            proof = base64.b64decode(attributes[-1][1], validate=True)
        except ValueError:
            raise ScramError("malformed client-final-message") from None
        if not hmac.compare_digest(binding, self._gs2_header.encode("utf-8")):
            raise ScramError("channel binding data does not match")
        if not hmac.compare_digest(attributes[1][1].encode(), self._nonce.encode()):
            raise ScramError("nonce does not match")
        without_proof = text[:text.rindex(",p=")]
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode("utf-8")
        signature = _hmac(self._verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("invalid proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        matches = hmac.compare_digest(hashlib.sha256(client_key).digest(),
                                      self._verifier.stored_key)
        if not (matches and self._valid):
            raise ScramError("password does not match")
        self.succeeded = True
        server_signature = _hmac(self._verifier.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """The client side, for tests and tools."""

    def __init__(self, password: str, user: str = "", gs2_header: str = "n,,") -> None:
        self._password = password
        self._gs2_header = gs2_header
        self._user = user
        self._nonce = base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode("ascii")
        self._client_first_bare = f"n={user},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"{self._gs2_header}{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8")
        attributes = dict(_attributes(text))
        nonce, salt, iterations = attributes["r"], base64.b64decode(attributes["s"]), \
            int(attributes["i"])
        if not nonce.startswith(self._nonce):
            raise ScramError("server nonce does not extend the client nonce")
        salted = salted_password(self._password, salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        stored_key = hashlib.sha256(client_key).digest()
        binding = base64.b64encode(self._gs2_header.encode()).decode()
        without_proof = f"c={binding},r={nonce}"
        auth_message = ",".join((self._client_first_bare, text, without_proof)).encode()
        signature = _hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        expected = b"v=" + base64.b64encode(self._server_signature)
        return hmac.compare_digest(server_final, expected)
