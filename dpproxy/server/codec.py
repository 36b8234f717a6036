"""The PostgreSQL v3 wire codec: bytes ⇄ message dataclasses, and value formats.

Pure and socket-free: `parse_startup` / `parse_frontend` decode what a client
sends, incrementally (``(None, 0)`` means "need more bytes"), with strict
length checks; every message encodes with `encode`. `parse_backend` exists so
tests (and tools) can read what the server sends.

>>> msg, used = parse_frontend(encode(Query("SELECT 1")))
>>> msg, used
(Query(sql='SELECT 1'), 14)
>>> parse_frontend(b"Q\\x00\\x00")
(None, 0)
>>> encode_value(1.5, FLOAT8, BINARY).hex()
'3ff8000000000000'
>>> decode_parameter(b"\\x00\\x1e", INT2, BINARY)
30
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import errors
from ..clock import parse_date

PROTOCOL_VERSION = 196608  # 3.0
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102
MAX_MESSAGE_SIZE = 16 * 1024 * 1024  # a larger length header is garbage or abuse
MAX_STARTUP_SIZE = 10_000  # PostgreSQL's own limit for the startup packet

TEXT, BINARY = 0, 1
POSTGRES_EPOCH = dt.date(2000, 1, 1)
POSTGRES_EPOCH_DATETIME = dt.datetime(2000, 1, 1)

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
_F32 = struct.Struct("!f")
_F64 = struct.Struct("!d")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(errors.Error):
    """The byte stream is not a valid PostgreSQL v3 conversation; the connection ends."""

    sqlstate = "08P01"


class InvalidTextRepresentation(errors.DataError):
    sqlstate = "22P02"


class InvalidBinaryRepresentation(errors.DataError):
    sqlstate = "22P03"


class CharacterNotInRepertoire(errors.DataError):
    sqlstate = "22021"


class DatetimeFieldOverflow(errors.DataError):
    sqlstate = "22008"


class UndefinedFunction(errors.ProgrammingError):
    sqlstate = "42883"


# types ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PgType:
    name: str
    oid: int
    size: int  # typlen: bytes, or -1 for variable length
    element: int = 0  # element type oid for arrays


_TYPES = [
    PgType("bool", 16, 1), PgType("bytea", 17, -1), PgType("char", 18, 1),
    PgType("name", 19, 64), PgType("int8", 20, 8), PgType("int2", 21, 2),
    PgType("int2vector", 22, -1), PgType("int4", 23, 4), PgType("regproc", 24, 4),
    PgType("text", 25, -1), PgType("oid", 26, 4), PgType("tid", 27, 6), PgType("xid", 28, 4),
    PgType("cid", 29, 4), PgType("oidvector", 30, -1), PgType("json", 114, -1),
    PgType("xml", 142, -1), PgType("pg_node_tree", 194, -1), PgType("float4", 700, 4),
    PgType("float8", 701, 8), PgType("unknown", 705, -2), PgType("inet", 869, -1),
    PgType("aclitem", 1033, 12), PgType("bpchar", 1042, -1), PgType("varchar", 1043, -1),
    PgType("date", 1082, 4), PgType("time", 1083, 8), PgType("timestamp", 1114, 8),
    PgType("timestamptz", 1184, 8), PgType("interval", 1186, 16), PgType("numeric", 1700, -1),
    PgType("regprocedure", 2202, 4), PgType("regoper", 2203, 4), PgType("regclass", 2205, 4),
    PgType("regtype", 2206, 4), PgType("void", 2278, 4), PgType("uuid", 2950, 16),
    PgType("jsonb", 3802, -1), PgType("regnamespace", 4089, 4), PgType("regrole", 4096, 4),
    PgType("_bool", 1000, -1, 16), PgType("_char", 1002, -1, 18), PgType("_name", 1003, -1, 19),
    PgType("_int2", 1005, -1, 21), PgType("_int4", 1007, -1, 23), PgType("_text", 1009, -1, 25),
    PgType("_varchar", 1015, -1, 1043), PgType("_int8", 1016, -1, 20),
    PgType("_float4", 1021, -1, 700), PgType("_float8", 1022, -1, 701),
    PgType("_oid", 1028, -1, 26), PgType("_aclitem", 1034, -1, 1033),
    PgType("_date", 1182, -1, 1082), PgType("_numeric", 1231, -1, 1700),
    PgType("_regtype", 2211, -1, 2206),
]
TYPES_BY_NAME = {t.name: t for t in _TYPES}
TYPES_BY_OID = {t.oid: t for t in _TYPES}
_ALIASES = {
    "boolean": "bool", "bigint": "int8", "integer": "int4", "int": "int4", "smallint": "int2",
    "double precision": "float8", "double": "float8", "real": "float4", "float": "float8",
    "decimal": "numeric", "character varying": "varchar", "character": "bpchar",
    "string": "text", "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz", '"char"': "char",
}
BOOL, INT8, INT2, INT4, TEXT_OID, OID = 16, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, VARCHAR, DATE, TIMESTAMP, NUMERIC = 700, 701, 705, 1043, 1082, 1114, 1700
_INTEGER_OIDS = {INT2, INT4, INT8, OID, 24, 28, 29, 2202, 2203, 2205, 2206, 4089, 4096}
_TEXT_OIDS = {TEXT_OID, VARCHAR, 1042, 19, 18, UNKNOWN, 0, 114, 3802, 142, 194}


def find_type(name: str) -> PgType | None:
    """The type a PostgreSQL type name (or alias) names; None for a name it does not know.

    >>> find_type("double precision").oid, find_type("INTEGER").oid, find_type("nope")
    (701, 23, None)
    """
    key = " ".join(name.split()).lower()
    if "(" in key:  # numeric(10, 2), varchar(20): the type without its modifier
        key = key[:key.index("(")].strip()
    return TYPES_BY_NAME.get(_ALIASES.get(key, key))


def pg_type(name: str) -> PgType:
    """The type for a PostgreSQL type name (`int8`, `bigint`, `text[]`, `_text`); text when
    unknown, since every value has a text form."""
    key = name.strip().lower()
    if key.endswith("[]"):
        element = pg_type(key[:-2])
        return TYPES_BY_NAME.get("_" + element.name, TYPES_BY_NAME["_text"])
    return find_type(key) or TYPES_BY_NAME["text"]


# reading helpers ------------------------------------------------------------------------------
class _Reader:
    """A cursor over one message body; every read is bounds-checked."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolViolation(f"invalid {self.what} message: insufficient data left")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def byte(self) -> bytes:
        return self._take(1)

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def uint32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def cstring(self) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolViolation(f"invalid {self.what} message: unterminated string")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation(f"invalid {self.what} message: string is not UTF-8") from None

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.pos)

    def count(self, what: str) -> int:
        n = self.int16()
        if n < 0:
            raise ProtocolViolation(f"invalid {self.what} message: negative {what} count")
        return n

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolViolation(f"invalid {self.what} message: {len(self.data) - self.pos} "
                                    "unexpected trailing bytes")


def _cstr(text: str) -> bytes:
    raw = text.encode("utf-8")
    if b"\x00" in raw:
        raise ValueError("strings on the wire cannot contain NUL")
    return raw + b"\x00"


def _frame(code: bytes, body: bytes) -> bytes:
    return code + _I32.pack(len(body) + 4) + body


# messages ---------------------------------------------------------------------------------------
class Message:
    """A typed message; subclasses set `code` and implement `body` / `decode`."""

    code: ClassVar[bytes] = b""

    def body(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, reader: _Reader) -> Message:
        return cls()

    def encode(self) -> bytes:
        return _frame(self.code, self.body())


# startup phase (no type byte) -----------------------------------------------------------------
@dataclass(frozen=True)
class SSLRequest:
    def encode(self) -> bytes:
        return _I32.pack(8) + _I32.pack(SSL_REQUEST_CODE)


@dataclass(frozen=True)
class GSSENCRequest:
    def encode(self) -> bytes:
        return _I32.pack(8) + _I32.pack(GSSENC_REQUEST_CODE)


@dataclass(frozen=True)
class CancelRequest:
    process_id: int
    secret_key: int

    def encode(self) -> bytes:
        return (_I32.pack(16) + _I32.pack(CANCEL_REQUEST_CODE) + _U32.pack(self.process_id)
                + _U32.pack(self.secret_key))


@dataclass(frozen=True)
class StartupMessage:
    version: int
    parameters: dict[str, str] = field(default_factory=dict)

    @property
    def major(self) -> int:
        return self.version >> 16

    @property
    def minor(self) -> int:
        return self.version & 0xFFFF

    def encode(self) -> bytes:
        body = _I32.pack(self.version) + b"".join(
            _cstr(k) + _cstr(v) for k, v in self.parameters.items()) + b"\x00"
        return _I32.pack(len(body) + 4) + body


StartupPacket = SSLRequest | GSSENCRequest | CancelRequest | StartupMessage


def parse_startup(buffer: bytes | bytearray) -> tuple[StartupPacket | None, int]:
    """Decode the first packet of a connection (it has no type byte)."""
    if len(buffer) < 4:
        return None, 0
    length = _I32.unpack_from(buffer, 0)[0]
    if not 8 <= length <= MAX_STARTUP_SIZE:
        raise ProtocolViolation("invalid length of startup packet")
    if len(buffer) < length:
        return None, 0
    code = _I32.unpack_from(buffer, 4)[0]
    if code == SSL_REQUEST_CODE:
        if length != 8:
            raise ProtocolViolation("invalid length of SSLRequest")
        return SSLRequest(), 8
    if code == GSSENC_REQUEST_CODE:
        if length != 8:
            raise ProtocolViolation("invalid length of GSSENCRequest")
        return GSSENCRequest(), 8
    if code == CANCEL_REQUEST_CODE:
        if length != 16:
            raise ProtocolViolation("invalid length of CancelRequest")
        pid, secret = struct.unpack_from("!II", buffer, 8)
        return CancelRequest(pid, secret), 16
    reader = _Reader(bytes(buffer[8:length]), "startup packet")
    parameters: dict[str, str] = {}
    while True:
        key = reader.cstring()
        if not key:
            break
        parameters[key] = reader.cstring()
    reader.done()
    return StartupMessage(code, parameters), length


# frontend messages -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Query(Message):
    code: ClassVar[bytes] = b"Q"
    sql: str

    def body(self) -> bytes:
        return _cstr(self.sql)

    @classmethod
    def decode(cls, reader: _Reader) -> Query:
        return cls(reader.cstring())


@dataclass(frozen=True)
class Parse(Message):
    code: ClassVar[bytes] = b"P"
    name: str
    sql: str
    param_oids: tuple[int, ...] = ()

    def body(self) -> bytes:
        return (_cstr(self.name) + _cstr(self.sql) + _I16.pack(len(self.param_oids))
                + b"".join(_U32.pack(o) for o in self.param_oids))

    @classmethod
    def decode(cls, reader: _Reader) -> Parse:
        name, sql = reader.cstring(), reader.cstring()
        oids = tuple(reader.uint32() for _ in range(reader.count("parameter type")))
        return cls(name, sql, oids)


@dataclass(frozen=True)
class Bind(Message):
    code: ClassVar[bytes] = b"B"
    portal: str
    statement: str
    param_formats: tuple[int, ...] = ()
    params: tuple[bytes | None, ...] = ()
    result_formats: tuple[int, ...] = ()

    def body(self) -> bytes:
        parts = [_cstr(self.portal), _cstr(self.statement), _I16.pack(len(self.param_formats))]
        parts += [_I16.pack(f) for f in self.param_formats]
        parts.append(_I16.pack(len(self.params)))
        for value in self.params:
            parts.append(_I32.pack(-1) if value is None else _I32.pack(len(value)) + value)
        parts.append(_I16.pack(len(self.result_formats)))
        parts += [_I16.pack(f) for f in self.result_formats]
        return b"".join(parts)

    @classmethod
    def decode(cls, reader: _Reader) -> Bind:
        portal, statement = reader.cstring(), reader.cstring()
        formats = tuple(reader.int16() for _ in range(reader.count("parameter format")))
        params: list[bytes | None] = []
        for _ in range(reader.count("parameter")):
            n = reader.int32()
            if n < -1:
                raise ProtocolViolation("invalid Bind message: negative parameter length")
            params.append(None if n == -1 else reader._take(n))
        results = tuple(reader.int16() for _ in range(reader.count("result format")))
        # (a format code other than text and binary is a well-formed Bind: the connection
        # refuses it as an ordinary error, as PostgreSQL does)
        return cls(portal, statement, formats, tuple(params), results)


@dataclass(frozen=True)
class Describe(Message):
    code: ClassVar[bytes] = b"D"
    kind: str  # "S" statement or "P" portal
    name: str

    def body(self) -> bytes:
        return self.kind.encode("ascii") + _cstr(self.name)

    @classmethod
    def decode(cls, reader: _Reader) -> Describe:
        kind = reader.byte()
        if kind not in (b"S", b"P"):
            raise ProtocolViolation(f"invalid DESCRIBE message subtype {kind!r}")
        return cls(kind.decode("ascii"), reader.cstring())


@dataclass(frozen=True)
class Execute(Message):
    code: ClassVar[bytes] = b"E"
    portal: str
    max_rows: int = 0

    def body(self) -> bytes:
        return _cstr(self.portal) + _I32.pack(self.max_rows)

    @classmethod
    def decode(cls, reader: _Reader) -> Execute:
        return cls(reader.cstring(), reader.int32())


@dataclass(frozen=True)
class Close(Message):
    code: ClassVar[bytes] = b"C"
    kind: str  # "S" or "P"
    name: str

    def body(self) -> bytes:
        return self.kind.encode("ascii") + _cstr(self.name)

    @classmethod
    def decode(cls, reader: _Reader) -> Close:
        kind = reader.byte()
        if kind not in (b"S", b"P"):
            raise ProtocolViolation(f"invalid CLOSE message subtype {kind!r}")
        return cls(kind.decode("ascii"), reader.cstring())


@dataclass(frozen=True)
class Sync(Message):
    code: ClassVar[bytes] = b"S"


@dataclass(frozen=True)
class Flush(Message):
    code: ClassVar[bytes] = b"H"


@dataclass(frozen=True)
class Terminate(Message):
    code: ClassVar[bytes] = b"X"


@dataclass(frozen=True)
class PasswordMessage(Message):
    """'p': a password, SASLInitialResponse or SASLResponse; which one depends on the
    authentication step, so the body is decoded by the caller."""

    code: ClassVar[bytes] = b"p"
    data: bytes

    def body(self) -> bytes:
        return self.data

    @classmethod
    def decode(cls, reader: _Reader) -> PasswordMessage:
        return cls(reader.rest())


@dataclass(frozen=True)
class SASLInitialResponse:
    mechanism: str
    response: bytes | None

    @classmethod
    def from_password_message(cls, message: PasswordMessage) -> SASLInitialResponse:
        reader = _Reader(message.data, "SASLInitialResponse")
        mechanism = reader.cstring()
        n = reader.int32()
        response = None if n == -1 else reader._take(n)
        reader.done()
        return cls(mechanism, response)

    def to_password_message(self) -> PasswordMessage:
        data = _cstr(self.mechanism) + (_I32.pack(-1) if self.response is None
                                        else _I32.pack(len(self.response)) + self.response)
        return PasswordMessage(data)


@dataclass(frozen=True)
class FunctionCall(Message):
    code: ClassVar[bytes] = b"F"
    data: bytes = b""

    def body(self) -> bytes:
        return self.data

    @classmethod
    def decode(cls, reader: _Reader) -> FunctionCall:
        return cls(reader.rest())


@dataclass(frozen=True)
class CopyData(Message):
    code: ClassVar[bytes] = b"d"
    data: bytes = b""

    def body(self) -> bytes:
        return self.data

    @classmethod
    def decode(cls, reader: _Reader) -> CopyData:
        return cls(reader.rest())


@dataclass(frozen=True)
class CopyDone(Message):
    code: ClassVar[bytes] = b"c"


@dataclass(frozen=True)
class CopyFail(Message):
    code: ClassVar[bytes] = b"f"
    reason: str = ""

    def body(self) -> bytes:
        return _cstr(self.reason)

    @classmethod
    def decode(cls, reader: _Reader) -> CopyFail:
        return cls(reader.cstring())


FRONTEND: dict[bytes, type[Message]] = {m.code: m for m in (
    Query, Parse, Bind, Describe, Execute, Close, Sync, Flush, Terminate, PasswordMessage,
    FunctionCall, CopyData, CopyDone, CopyFail)}


def _parse_typed(buffer: bytes | bytearray, registry: dict[bytes, type[Message]], side: str
                 ) -> tuple[Message | None, int]:
    if len(buffer) < 5:
        return None, 0
    code, length = _HEADER.unpack_from(buffer, 0)
    cls = registry.get(code)
    if cls is None:
        shown = code.decode("latin-1")
        raise ProtocolViolation(f"invalid {side} message type {shown!r}" if shown.isprintable()
                                else f"invalid {side} message type {code[0]}")
    if not 4 <= length <= MAX_MESSAGE_SIZE:
        raise ProtocolViolation(f"invalid message length {length}")
    if len(buffer) < length + 1:
        return None, 0
    reader = _Reader(bytes(buffer[5:length + 1]), cls.__name__)
    message = cls.decode(reader)
    reader.done()
    return message, length + 1


def parse_frontend(buffer: bytes | bytearray) -> tuple[Message | None, int]:
    """Decode one client message from the start of `buffer`: (message, bytes used), or
    (None, 0) when more bytes are needed. Raises ProtocolViolation on garbage."""
    return _parse_typed(buffer, FRONTEND, "frontend")


# backend messages ------------------------------------------------------------------------------
AUTH_OK, AUTH_CLEARTEXT, AUTH_MD5 = 0, 3, 5
AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL = 10, 11, 12


@dataclass(frozen=True)
class Authentication(Message):
    code: ClassVar[bytes] = b"R"
    kind: int
    data: bytes = b""  # SASL: mechanism list, or the server's challenge / final message

    def body(self) -> bytes:
        return _I32.pack(self.kind) + self.data

    @classmethod
    def decode(cls, reader: _Reader) -> Authentication:
        return cls(reader.int32(), reader.rest())

    @classmethod
    def sasl(cls, mechanisms: Sequence[str]) -> Authentication:
        return cls(AUTH_SASL, b"".join(_cstr(m) for m in mechanisms) + b"\x00")


@dataclass(frozen=True)
class ParameterStatus(Message):
    code: ClassVar[bytes] = b"S"
    name: str
    value: str

    def body(self) -> bytes:
        return _cstr(self.name) + _cstr(self.value)

    @classmethod
    def decode(cls, reader: _Reader) -> ParameterStatus:
        return cls(reader.cstring(), reader.cstring())


@dataclass(frozen=True)
class BackendKeyData(Message):
    code: ClassVar[bytes] = b"K"
    process_id: int
    secret_key: int

    def body(self) -> bytes:
        return _U32.pack(self.process_id) + _U32.pack(self.secret_key)

    @classmethod
    def decode(cls, reader: _Reader) -> BackendKeyData:
        return cls(reader.uint32(), reader.uint32())


@dataclass(frozen=True)
class ReadyForQuery(Message):
    code: ClassVar[bytes] = b"Z"
    status: str  # I idle, T in a transaction block, E in a failed transaction block

    def body(self) -> bytes:
        return self.status.encode("ascii")

    @classmethod
    def decode(cls, reader: _Reader) -> ReadyForQuery:
        return cls(reader.byte().decode("ascii"))


@dataclass(frozen=True)
class Field:
    name: str
    type_oid: int
    type_size: int = -1
    format: int = TEXT
    table_oid: int = 0
    column_number: int = 0
    type_modifier: int = -1


@dataclass(frozen=True)
class RowDescription(Message):
    code: ClassVar[bytes] = b"T"
    fields: tuple[Field, ...]

    def body(self) -> bytes:
        parts = [_I16.pack(len(self.fields))]
        for f in self.fields:
            parts.append(_cstr(f.name) + struct.pack("!IhIhih", f.table_oid, f.column_number,
                                                     f.type_oid, f.type_size, f.type_modifier,
                                                     f.format))
        return b"".join(parts)

    @classmethod
    def decode(cls, reader: _Reader) -> RowDescription:
        fields = []
        for _ in range(reader.count("field")):
            name = reader.cstring()
            table, column, oid, size, modifier, fmt = struct.unpack("!IhIhih", reader._take(18))
            fields.append(Field(name, oid, size, fmt, table, column, modifier))
        return cls(tuple(fields))


@dataclass(frozen=True)
class DataRow(Message):
    code: ClassVar[bytes] = b"D"
    values: tuple[bytes | None, ...]

    def body(self) -> bytes:
        parts = [_I16.pack(len(self.values))]
        for v in self.values:
            parts.append(b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + v)
        return b"".join(parts)

    @classmethod
    def decode(cls, reader: _Reader) -> DataRow:
        values: list[bytes | None] = []
        for _ in range(reader.count("column")):
            n = reader.int32()
            values.append(None if n == -1 else reader._take(n))
        return cls(tuple(values))


def data_row_bytes(values: Sequence[bytes | None]) -> bytes:
    """`DataRow(values).encode()`, without building the message object."""
    parts = [_I16.pack(len(values))]
    for v in values:
        parts.append(b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + v)
    body = b"".join(parts)
    return b"D" + _I32.pack(len(body) + 4) + body


@dataclass(frozen=True)
class CommandComplete(Message):
    code: ClassVar[bytes] = b"C"
    tag: str

    def body(self) -> bytes:
        return _cstr(self.tag)

    @classmethod
    def decode(cls, reader: _Reader) -> CommandComplete:
        return cls(reader.cstring())


@dataclass(frozen=True)
class EmptyQueryResponse(Message):
    code: ClassVar[bytes] = b"I"


# ErrorResponse / NoticeResponse field codes
SEVERITY, SEVERITY_V, SQLSTATE, MESSAGE, DETAIL, HINT, POSITION = "S", "V", "C", "M", "D", "H", "P"


@dataclass(frozen=True)
class ErrorResponse(Message):
    code: ClassVar[bytes] = b"E"
    fields: tuple[tuple[str, str], ...]

    def body(self) -> bytes:
        return b"".join(k.encode("ascii") + _cstr(v) for k, v in self.fields) + b"\x00"

    @classmethod
    def decode(cls, reader: _Reader) -> ErrorResponse:
        fields = []
        while True:
            key = reader.byte()
            if key == b"\x00":
                break
            fields.append((key.decode("ascii"), reader.cstring()))
        return cls(tuple(fields))

    @classmethod
    def build(cls, severity: str, sqlstate: str, message: str, detail: str | None = None,
              hint: str | None = None, position: int | None = None) -> ErrorResponse:
        items = [(SEVERITY, severity), (SEVERITY_V, severity), (SQLSTATE, sqlstate),
                 (MESSAGE, message)]
        if detail:
            items.append((DETAIL, detail))
        if hint:
            items.append((HINT, hint))
        if position:
            items.append((POSITION, str(position)))
        return cls(tuple(items))

    @classmethod
    def from_error(cls, error: errors.Error, severity: str = "ERROR") -> ErrorResponse:
        return cls.build(severity, error.sqlstate, error.message, error.detail, error.hint,
                         error.position)

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.fields if k == key), None)


@dataclass(frozen=True)
class NoticeResponse(ErrorResponse):
    code: ClassVar[bytes] = b"N"

    @classmethod
    def notice(cls, message: str) -> NoticeResponse:
        return cls(((SEVERITY, "NOTICE"), (SEVERITY_V, "NOTICE"), (SQLSTATE, "00000"),
                    (MESSAGE, message)))


_NOTICE_HEAD = b"".join(k.encode("ascii") + _cstr(v) for k, v in (
    (SEVERITY, "NOTICE"), (SEVERITY_V, "NOTICE"), (SQLSTATE, "00000"))) + MESSAGE.encode()


def notice_bytes(message: str) -> bytes:
    """`NoticeResponse.notice(message).encode()`, without building the message object."""
    return _frame(b"N", _NOTICE_HEAD + _cstr(message) + b"\x00")


@dataclass(frozen=True)
class ParseComplete(Message):
    code: ClassVar[bytes] = b"1"


@dataclass(frozen=True)
class BindComplete(Message):
    code: ClassVar[bytes] = b"2"


@dataclass(frozen=True)
class CloseComplete(Message):
    code: ClassVar[bytes] = b"3"


@dataclass(frozen=True)
class NoData(Message):
    code: ClassVar[bytes] = b"n"


@dataclass(frozen=True)
class PortalSuspended(Message):
    code: ClassVar[bytes] = b"s"


@dataclass(frozen=True)
class ParameterDescription(Message):
    code: ClassVar[bytes] = b"t"
    oids: tuple[int, ...]

    def body(self) -> bytes:
        return _I16.pack(len(self.oids)) + b"".join(_U32.pack(o) for o in self.oids)

    @classmethod
    def decode(cls, reader: _Reader) -> ParameterDescription:
        return cls(tuple(reader.uint32() for _ in range(reader.count("parameter"))))


@dataclass(frozen=True)
class NegotiateProtocolVersion(Message):
    code: ClassVar[bytes] = b"v"
    newest_minor: int
    unrecognized: tuple[str, ...] = ()

    def body(self) -> bytes:
        return (_I32.pack(self.newest_minor) + _I32.pack(len(self.unrecognized))
                + b"".join(_cstr(o) for o in self.unrecognized))

    @classmethod
    def decode(cls, reader: _Reader) -> NegotiateProtocolVersion:
        minor, n = reader.int32(), reader.int32()
        return cls(minor, tuple(reader.cstring() for _ in range(n)))


BACKEND: dict[bytes, type[Message]] = {m.code: m for m in (
    Authentication, ParameterStatus, BackendKeyData, ReadyForQuery, RowDescription, DataRow,
    CommandComplete, EmptyQueryResponse, ErrorResponse, NoticeResponse, ParseComplete,
    BindComplete, CloseComplete, NoData, PortalSuspended, ParameterDescription,
    NegotiateProtocolVersion)}


def parse_backend(buffer: bytes | bytearray) -> tuple[Message | None, int]:
    """Decode one server message (the client side of `parse_frontend`)."""
    return _parse_typed(buffer, BACKEND, "backend")


def encode(message: Message | StartupPacket) -> bytes:
    """The bytes of one message."""
    return message.encode()


# values: results ----------------------------------------------------------------------------
def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text  # PostgreSQL prints 3, not 3.0


def _array_text(values: Sequence[Any], element: int) -> str:
    items = []
    for v in values:
        if v is None:
            items.append("NULL")
            continue
        text = _text_value(v, element)
        if text == "" or any(c in text for c in ' ,{}"\\') or text.upper() == "NULL":
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        items.append(text)
    return "{" + ",".join(items) + "}"


def _text_value(value: Any, oid: int) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if oid in _INTEGER_OIDS and value.is_integer():
            return str(int(value))
        return _float_text(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, list | tuple):
        element = TYPES_BY_OID[oid].element if oid in TYPES_BY_OID else TEXT_OID
        return _array_text(value, element or TEXT_OID)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _integral(value: Any, oid: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
        try:
            return int(str(value))
        except ValueError:
            raise errors.DatatypeMismatch(f"cannot send {value!r} as type oid {oid}") from None
    if isinstance(value, float | decimal.Decimal) and value != int(value):
        raise errors.DatatypeMismatch(f"cannot send {value!r} as an integer")
    return int(value)


def _numeric_binary(value: Any) -> bytes:
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(
        repr(value) if isinstance(value, float) else str(value))
    if d.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    if d.is_infinite():
        return struct.pack("!hhHH", 0, 0, 0xF000 if d < 0 else 0xD000, 0)
    sign, digit_tuple, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    if exponent > 0:
        digits, exponent = digits + "0" * exponent, 0
    dscale = -exponent
    integer = digits[:len(digits) - dscale] if dscale else digits
    fraction = digits[len(digits) - dscale:] if dscale else ""
    if len(fraction) < dscale:
        fraction = fraction.rjust(dscale, "0")
    integer = integer.lstrip("0")
    integer = integer.rjust((len(integer) + 3) // 4 * 4, "0")
    fraction = fraction.ljust((len(fraction) + 3) // 4 * 4, "0")
    groups = [int(integer[i:i + 4]) for i in range(0, len(integer), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHH{len(groups)}H", len(groups), weight, 0x4000 if sign else 0,
                       dscale, *groups)


def _numeric_from_binary(data: bytes) -> decimal.Decimal:
    if len(data) < 8:
        raise InvalidBinaryRepresentation("insufficient data for a numeric value")
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHH", data, 0)
    if ndigits < 0 or len(data) != 8 + 2 * ndigits:
        raise InvalidBinaryRepresentation("invalid length of a binary numeric value")
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return decimal.Decimal("-Infinity" if sign == 0xF000 else "Infinity")
    if sign not in (0, 0x4000):
        raise InvalidBinaryRepresentation("invalid sign in a binary numeric value")
    groups = struct.unpack_from(f"!{ndigits}H", data, 8)
    if any(g > 9999 for g in groups):
        raise InvalidBinaryRepresentation("invalid digit in a binary numeric value")
    value = 0
    for g in groups:
        value = value * 10000 + g
    exponent = 4 * (weight - ndigits + 1)
    with decimal.localcontext() as ctx:
        ctx.prec = max(28, 4 * ndigits + 8)
        result = decimal.Decimal(value).scaleb(exponent)
        result = result.quantize(decimal.Decimal(1).scaleb(-dscale)) if dscale <= 1000 \
            else result
    return -result if sign == 0x4000 else result


def _array_binary(values: Sequence[Any], element: int) -> bytes:
    parts = [struct.pack("!iiI", 1, int(any(v is None for v in values)), element),
             struct.pack("!ii", len(values), 1)]
    for v in values:
        if v is None:
            parts.append(_I32.pack(-1))
        else:
            raw = _binary_value(v, element)
            parts.append(_I32.pack(len(raw)) + raw)
    if not values:  # PostgreSQL writes an empty array with zero dimensions
        return struct.pack("!iiI", 0, 0, element)
    return b"".join(parts)


def _binary_value(value: Any, oid: int) -> bytes:
    if oid == INT8:
        return _I64.pack(_integral(value, oid))
    if oid == INT4:
        return _I32.pack(_integral(value, oid))
    if oid == INT2:
        return _I16.pack(_integral(value, oid))
    if oid in _INTEGER_OIDS:  # oid and the reg* types travel as unsigned 32-bit oids
        return _U32.pack(_integral(value, oid))
    if oid == FLOAT8:
        return _F64.pack(float(value))
    if oid == FLOAT4:
        return _F32.pack(float(value))
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid == NUMERIC:
        return _numeric_binary(value)
    if oid == DATE:
        day = value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
        if isinstance(day, dt.datetime):
            day = day.date()
        return _I32.pack((day - POSTGRES_EPOCH).days)
    if oid in (TIMESTAMP, 1184):
        moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(
            str(value))
        delta = moment.replace(tzinfo=None) - POSTGRES_EPOCH_DATETIME
        return _I64.pack((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if oid == 17:
        return bytes(value)
    if oid in _TEXT_OIDS:
        return _text_value(value, oid).encode("utf-8")
    known = TYPES_BY_OID.get(oid)
    if known is not None and known.element and isinstance(value, list | tuple):
        return _array_binary(value, known.element)
    name = known.name if known else str(oid)
    raise UndefinedFunction(f"no binary output function available for type {name}",
                            hint="request text format for this column")


def encode_value(value: Any, type_oid: int, fmt: int = TEXT) -> bytes | None:
    """One result value in text or binary format; None is SQL NULL."""
    if value is None:
        return None
    if fmt == BINARY:
        return _binary_value(value, type_oid)
    return _text_value(value, type_oid).encode("utf-8")


def value_encoder(type_oid: int, fmt: int = TEXT) -> Callable[[Any], bytes | None]:
    """A fast encoder for one column; chosen once per result column."""
    if fmt == TEXT:
        if type_oid in (TEXT_OID, VARCHAR, 19):
            return lambda v: None if v is None else str(v).encode("utf-8")
        if type_oid == INT8:
            return lambda v: None if v is None else (
                str(v).encode("ascii") if type(v) is int else _text_value(v, INT8).encode())
    elif type_oid == INT8:
        return lambda v: None if v is None else (
            _I64.pack(v) if type(v) is int else _binary_value(v, INT8))
    elif type_oid == FLOAT8:
        return lambda v: None if v is None else _F64.pack(float(v))
    return lambda v: encode_value(v, type_oid, fmt)


# values: parameters ---------------------------------------------------------------------------
_TRUE = {"t", "true", "y", "yes", "on", "1"}
_FALSE = {"f", "false", "n", "no", "off", "0"}


def _parameter_text(text: str, oid: int) -> Any:
    stripped = text.strip()
    known = TYPES_BY_OID.get(oid)
    name = known.name if known is not None else "text"
    if known is not None and known.element:
        return [None if item is None else _parameter_text(item, known.element)
                for item in array_items(stripped, name)]
    try:
        if oid in (INT2, INT4, INT8, OID):
            value = int(stripped)
            bits = {INT2: 16, INT4: 32, INT8: 64}.get(oid)
            if bits and not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                raise errors.DataError(f"value \"{text}\" is out of range for type {name}")
            return value
        if oid in (FLOAT4, FLOAT8):
            return float(stripped)
        if oid == NUMERIC:
            return decimal.Decimal(stripped)
        if oid == BOOL:
            low = stripped.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if oid == DATE:
            return parse_date(stripped)
        if oid in (TIMESTAMP, 1184):
            return dt.datetime.fromisoformat(stripped)
    except (ValueError, decimal.InvalidOperation):
        raise InvalidTextRepresentation(
            f"invalid input syntax for type {name}: \"{text}\"") from None
    return text


def array_items(text: str, name: str) -> list[str | None]:
    r"""The items of a one-dimensional array literal in PostgreSQL's text form
    (`{1,2}`, `{"a b",NULL,"say \"hi\""}`): strings, None for an unquoted NULL; the
    catalog's array literals are read by it too.

    >>> array_items('{1, 2,3}', "_int8")
    ['1', '2', '3']
    >>> array_items(r'{"a,b",NULL,"NULL",c\,d}', "_text")
    ['a,b', None, 'NULL', 'c,d']
    """
    bad = InvalidTextRepresentation(f"malformed array literal for type {name}: \"{text}\"",
                                    hint="one-dimensional arrays only, as {1,2,3}")
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        raise bad
    body = text[1:-1]
    if not body.strip():
        return []
    items: list[str | None] = []
    i = 0
    while True:
        while i < len(body) and body[i].isspace():
            i += 1
        if i < len(body) and body[i] == '"':
            i += 1
            chars = []
            while i < len(body) and body[i] != '"':
                if body[i] == "\\":
                    i += 1
                if i < len(body):
                    chars.append(body[i])
                i += 1
            if i >= len(body):
                raise bad
            i += 1
            item: str | None = "".join(chars)
        else:
            chars = []
            while i < len(body) and body[i] not in ',{}"':
                if body[i] == "\\":
                    i += 1
                if i < len(body):
                    chars.append(body[i])
                i += 1
            word = "".join(chars).strip()
            if not word or (i < len(body) and body[i] in '{}"'):
                raise bad  # an empty item, or a nested array
            item = None if word.upper() == "NULL" else word
        items.append(item)
        while i < len(body) and body[i].isspace():
            i += 1
        if i == len(body):
            return items
        if body[i] != ",":
            raise bad
        i += 1


def _array_from_binary(data: bytes, position: int) -> list[Any]:
    reader = _Reader(data, "array parameter")
    try:
        ndim, _flags, element = reader.int32(), reader.int32(), reader.uint32()
        if ndim == 0:
            return []
        if ndim != 1:
            raise InvalidBinaryRepresentation("only one-dimensional array parameters are "
                                              "supported")
        length, _lower = reader.int32(), reader.int32()
        if length < 0 or length > len(data):
            raise InvalidBinaryRepresentation("invalid array length")
        items: list[Any] = []
        for _ in range(length):
            n = reader.int32()
            items.append(None if n == -1 else decode_parameter(reader._take(n), element,
                                                               BINARY, position))
        reader.done()
    except ProtocolViolation:
        raise InvalidBinaryRepresentation(
            f"incorrect binary data format in bind parameter {position}") from None
    return items


def decode_parameter(data: bytes | None, type_oid: int, fmt: int = TEXT,
                     position: int = 1) -> Any:
    """A Bind parameter as a Python value: int, float, Decimal, str, bool, date, list."""
    if data is None:
        return None
    if fmt == TEXT:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\"") \
                from None
        if "\x00" in text:
            raise CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\": 0x00")
        return _parameter_text(text, type_oid)
    sizes = {INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, BOOL: 1, DATE: 4,
             TIMESTAMP: 8, 1184: 8}
    if type_oid in sizes and len(data) != sizes[type_oid]:
        raise InvalidBinaryRepresentation(
            f"incorrect binary data format in bind parameter {position}")
    if type_oid == INT2:
        return _I16.unpack(data)[0]
    if type_oid == INT4:
        return _I32.unpack(data)[0]
    if type_oid == INT8:
        return _I64.unpack(data)[0]
    if type_oid == OID:
        return _U32.unpack(data)[0]
    if type_oid == FLOAT4:
        return _F32.unpack(data)[0]
    if type_oid == FLOAT8:
        return _F64.unpack(data)[0]
    if type_oid == BOOL:
        if data not in (b"\x00", b"\x01"):
            raise InvalidBinaryRepresentation(
                f"incorrect binary data format in bind parameter {position}")
        return data == b"\x01"
    try:  # beyond Python's years 1…9999 (PostgreSQL's infinity among them): out of range
        if type_oid == DATE:
            return POSTGRES_EPOCH + dt.timedelta(days=_I32.unpack(data)[0])
        if type_oid in (TIMESTAMP, 1184):
            return POSTGRES_EPOCH_DATETIME + dt.timedelta(microseconds=_I64.unpack(data)[0])
    except OverflowError:
        what = "date" if type_oid == DATE else "timestamp"
        raise DatetimeFieldOverflow(f"{what} out of range in bind parameter {position}") \
            from None
    if type_oid == NUMERIC:
        return _numeric_from_binary(data)
    known = TYPES_BY_OID.get(type_oid)
    if known is not None and known.element:
        return _array_from_binary(data, position)
    if type_oid == 17:
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\"") from None
    if "\x00" in text:  # as in text format: PostgreSQL's text holds no NUL
        raise CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\": 0x00")
    return text
