"""The wire codec without sockets: round trips, incremental decoding, malformed input, values."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import pytest

from dpproxy import errors
from dpproxy.server import codec
from dpproxy.server.codec import (
    BINARY,
    TEXT,
    ProtocolViolation,
    decode_parameter,
    encode,
    encode_value,
    parse_backend,
    parse_frontend,
    parse_startup,
)

FRONTEND = [
    codec.Query("SELECT 1"),
    codec.Query("SELECT 'é' -- ünïcode"),
    codec.Parse("", "SELECT $1::int8", (20,)),
    codec.Parse("s1", "SELECT COUNT(*) FROM adult WHERE age > $1 AND sex = $2", (21, 0)),
    codec.Bind("", "s1", (1, 0), (b"\x00\x1e", b"Male"), (1,)),
    codec.Bind("p", "", (), (None, b""), ()),
    codec.Describe("S", "s1"),
    codec.Describe("P", ""),
    codec.Execute("", 0),
    codec.Execute("p", 10),
    codec.Close("S", "s1"),
    codec.Close("P", "p"),
    codec.Sync(),
    codec.Flush(),
    codec.Terminate(),
    codec.PasswordMessage(b"n,,n=,r=abc"),
    codec.CopyFail("no"),
    codec.CopyDone(),
]

BACKEND = [
    codec.Authentication(codec.AUTH_OK),
    codec.Authentication.sasl(["SCRAM-SHA-256"]),
    codec.Authentication(codec.AUTH_SASL_CONTINUE, b"r=abc,s=c2FsdA==,i=4096"),
    codec.ParameterStatus("server_version", "15.0 (dpproxy 0.1.0)"),
    codec.BackendKeyData(4242, 0xFFFFFFFF),
    codec.ReadyForQuery("T"),
    codec.RowDescription((codec.Field("occupation", 25), codec.Field("n", 20, 8, BINARY))),
    codec.DataRow((b"Sales", None, b"")),
    codec.CommandComplete("SELECT 14"),
    codec.EmptyQueryResponse(),
    codec.ErrorResponse.build("ERROR", "42501", "no", detail="d", hint="h", position=3),
    codec.NoticeResponse.notice("count: laplace, scale 10"),
    codec.ParseComplete(), codec.BindComplete(), codec.CloseComplete(), codec.NoData(),
    codec.PortalSuspended(),
    codec.ParameterDescription((20, 25, 1082)),
    codec.NegotiateProtocolVersion(0, ("_pq_.x",)),
]


@pytest.mark.parametrize("message", FRONTEND, ids=lambda m: type(m).__name__)
def test_frontend_round_trip(message: codec.Message) -> None:
    data = encode(message)
    assert parse_frontend(data) == (message, len(data))
    # incremental: any strict prefix asks for more bytes
    for cut in range(len(data)):
        assert parse_frontend(data[:cut]) == (None, 0)


@pytest.mark.parametrize("message", BACKEND, ids=lambda m: type(m).__name__)
def test_backend_round_trip(message: codec.Message) -> None:
    data = encode(message)
    assert parse_backend(data) == (message, len(data))


def test_pipelined_messages_decode_one_at_a_time() -> None:
    data = b"".join(encode(m) for m in FRONTEND)
    decoded = []
    while data:
        message, used = parse_frontend(data)
        assert message is not None
        decoded.append(message)
        data = data[used:]
    assert decoded == FRONTEND


def test_startup_packets() -> None:
    startup = codec.StartupMessage(codec.PROTOCOL_VERSION, {"user": "alice", "database": "demo"})
    for packet in (codec.SSLRequest(), codec.GSSENCRequest(), codec.CancelRequest(7, 2 ** 32 - 1),
                   startup):
        data = encode(packet)
        assert parse_startup(data) == (packet, len(data))
        assert parse_startup(data[:-1]) == (None, 0)
    assert (startup.major, startup.minor) == (3, 0)


@pytest.mark.parametrize("data", [
    struct.pack("!ii", 4, 196608),  # shorter than a header
    struct.pack("!ii", 1_000_000, 196608),  # longer than any startup packet
    struct.pack("!ii", 12, 80877103) + b"\0\0\0\0",  # SSLRequest with a body
    struct.pack("!ii", 12, 196608) + b"user",  # parameters without terminator
    struct.pack("!ii", 13, 196608) + b"\xff\xfe\0\0\0",  # not UTF-8
])
def test_malformed_startup_packets(data: bytes) -> None:
    with pytest.raises(ProtocolViolation) as info:
        parse_startup(data)
    assert info.value.sqlstate == "08P01"


@pytest.mark.parametrize("data", [
    b"?\x00\x00\x00\x04",  # unknown message type
    b"\x00\x00\x00\x00\x08",  # garbage
    b"Q\x00\x00\x00\x02",  # length below its own size
    b"Q" + struct.pack("!i", codec.MAX_MESSAGE_SIZE + 1),  # oversized: refused from the header
    b"Q" + struct.pack("!i", -5),
    b"S\x00\x00\x00\x05x",  # Sync with a body
    b"Q\x00\x00\x00\x08abcd",  # unterminated string
    b"E\x00\x00\x00\x06\x00\x00",  # Execute without its row count
    b"B\x00\x00\x00\x0a\x00\x00\xff\xff\x00\x00",  # negative parameter-format count
    b"D\x00\x00\x00\x06X\x00",  # Describe of neither S nor P
])
def test_malformed_messages(data: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_frontend(data)


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    header = b"Q" + struct.pack("!i", 64 * 1024 * 1024)
    with pytest.raises(ProtocolViolation, match="invalid message length"):
        parse_frontend(header)


def test_sasl_initial_response_round_trip() -> None:
    initial = codec.SASLInitialResponse("SCRAM-SHA-256", b"n,,n=,r=nonce")
    assert codec.SASLInitialResponse.from_password_message(initial.to_password_message()) \
        == initial
    with pytest.raises(ProtocolViolation):
        codec.SASLInitialResponse.from_password_message(codec.PasswordMessage(b"SCRAM"))


def test_error_response_fields() -> None:
    err = errors.BudgetExceeded("out of budget", detail="d", hint="ask")
    response = codec.ErrorResponse.from_error(err)
    assert [response.get(k) for k in "SVCMDH"] == ["ERROR", "ERROR", "53400", "out of budget",
                                                   "d", "ask"]
    assert codec.ErrorResponse.from_error(err, "FATAL").get("S") == "FATAL"


# values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "oid", "text"), [
    (42, codec.INT8, "42"), (-7, codec.INT8, "-7"), (3.0, codec.INT8, "3"),
    (1.5, codec.FLOAT8, "1.5"), (3.0, codec.FLOAT8, "3"), (float("nan"), codec.FLOAT8, "NaN"),
    (float("inf"), codec.FLOAT8, "Infinity"), (1e-05, codec.FLOAT8, "1e-05"),
    (decimal.Decimal("12.50"), codec.NUMERIC, "12.50"), ("Sales", codec.TEXT_OID, "Sales"),
    (dt.date(2024, 7, 1), codec.DATE, "2024-07-01"), (True, codec.BOOL, "t"),
    (False, codec.BOOL, "f"), (["a", "b c", None], 1009, '{a,"b c",NULL}'),
])
def test_text_values(value: object, oid: int, text: str) -> None:
    assert encode_value(value, oid, TEXT) == text.encode()


def test_null_is_none_in_every_format() -> None:
    for oid in (codec.INT8, codec.FLOAT8, codec.TEXT_OID, codec.DATE, codec.BOOL):
        assert encode_value(None, oid, TEXT) is None
        assert encode_value(None, oid, BINARY) is None


@pytest.mark.parametrize(("value", "oid", "data"), [
    (30, codec.INT8, struct.pack("!q", 30)),
    (-2, codec.INT4, struct.pack("!i", -2)),
    (1.5, codec.FLOAT8, struct.pack("!d", 1.5)),
    (True, codec.BOOL, b"\x01"),
    (dt.date(2000, 1, 2), codec.DATE, struct.pack("!i", 1)),
    (dt.date(1999, 12, 31), codec.DATE, struct.pack("!i", -1)),
    ("Prof-specialty", codec.TEXT_OID, b"Prof-specialty"),
    ("é", codec.TEXT_OID, "é".encode()),
])
def test_binary_values_and_parameters(value: object, oid: int, data: bytes) -> None:
    assert encode_value(value, oid, BINARY) == data
    assert decode_parameter(data, oid, BINARY) == value


@pytest.mark.parametrize("text", ["0", "1", "-1", "12345.678", "0.0001", "-0.5", "10000",
                                  "123456789.000001", "1E+3", "3.14159265358979323846", "NaN"])
def test_numeric_binary_round_trip(text: str) -> None:
    value = decimal.Decimal(text)
    back = decode_parameter(encode_value(value, codec.NUMERIC, BINARY), codec.NUMERIC, BINARY)
    assert (back.is_nan() and value.is_nan()) or back == value


def test_numeric_binary_matches_postgres() -> None:
    # PostgreSQL sends 12345.678 as 3 base-10000 digits [1, 2345, 6780], weight 1, dscale 3
    assert encode_value(decimal.Decimal("12345.678"), codec.NUMERIC, BINARY) == \
        struct.pack("!hhHH3H", 3, 1, 0, 3, 1, 2345, 6780)


@pytest.mark.parametrize(("data", "oid", "value"), [
    (b"30", codec.INT8, 30), (b" 30 ", codec.INT4, 30), (b"1.5", codec.FLOAT8, 1.5),
    (b"2.50", codec.NUMERIC, decimal.Decimal("2.50")), (b"true", codec.BOOL, True),
    (b"off", codec.BOOL, False), (b"2024-07-01", codec.DATE, dt.date(2024, 7, 1)),
    # pgjdbc's setDate, and a time and zone, which a date ignores as PostgreSQL's does
    (b"2024-07-01 +00", codec.DATE, dt.date(2024, 7, 1)),
    (b"2024-07-01 23:30:00-08", codec.DATE, dt.date(2024, 7, 1)),
    (b"Sales", 0, "Sales"), (b"Sales", codec.VARCHAR, "Sales"), (None, codec.INT8, None),
])
def test_text_parameters(data: bytes | None, oid: int, value: object) -> None:
    assert decode_parameter(data, oid, TEXT) == value


def test_binary_small_integers_as_psycopg_sends_them() -> None:
    assert decode_parameter(b"\x00\x1e", codec.INT2, BINARY) == 30
    assert decode_parameter(struct.pack("!q", -(2 ** 62)), codec.INT8, BINARY) == -(2 ** 62)


def test_binary_oid_array_as_asyncpg_sends_it() -> None:
    data = bytes.fromhex("00000001000000000000001a00000001000000010000000400004003")
    assert decode_parameter(data, 1028, BINARY) == [16387]
    assert encode_value([16387], 1028, BINARY) == data


@pytest.mark.parametrize(("data", "oid", "fmt", "sqlstate"), [
    (b"abc", codec.INT8, TEXT, "22P02"),
    (b"1.5", codec.INT4, TEXT, "22P02"),
    (b"maybe", codec.BOOL, TEXT, "22P02"),
    (b"2024-13-01", codec.DATE, TEXT, "22P02"),
    (b"2024-07-01 junk", codec.DATE, TEXT, "22P02"),
    (b"2024-07-01 +25", codec.DATE, TEXT, "22P02"),
    (b"99999999999", codec.INT4, TEXT, "22000"),
    (b"\xff", codec.TEXT_OID, TEXT, "22021"),
    (b"\x00\x01\x02", codec.INT4, BINARY, "22P03"),
    (b"\x02", codec.BOOL, BINARY, "22P03"),
    (b"\x00\x01", codec.NUMERIC, BINARY, "22P03"),
])
def test_bad_parameters(data: bytes, oid: int, fmt: int, sqlstate: str) -> None:
    with pytest.raises(errors.Error) as info:
        decode_parameter(data, oid, fmt)
    assert info.value.sqlstate == sqlstate


def test_type_names() -> None:
    assert codec.pg_type("int8").oid == 20
    assert codec.pg_type("bigint").oid == 20
    assert codec.pg_type("double precision").oid == 701
    assert codec.pg_type("text[]").oid == 1009
    assert codec.pg_type("_oid").oid == 1028
    assert codec.pg_type("something-new").oid == 25  # unknown: text, which every value has


def test_value_encoders_agree_with_encode_value() -> None:
    for oid in (codec.INT8, codec.FLOAT8, codec.TEXT_OID, codec.DATE, codec.BOOL,
                codec.NUMERIC):
        for fmt in (TEXT, BINARY):
            value = {codec.INT8: 5, codec.FLOAT8: 2.25, codec.TEXT_OID: "x",
                     codec.DATE: dt.date(2020, 2, 29), codec.BOOL: True,
                     codec.NUMERIC: decimal.Decimal("1.5")}[oid]
            assert codec.value_encoder(oid, fmt)(value) == encode_value(value, oid, fmt)


@pytest.mark.parametrize("values", [(), (None,), (b"",), (b"1", None, b"x" * 300),
                                    tuple(str(n).encode() for n in range(40))])
def test_data_rows_encoded_directly_are_the_messages(values: tuple[bytes | None, ...]) -> None:
    data = codec.data_row_bytes(list(values))
    assert data == codec.DataRow(values).encode()
    assert codec.parse_backend(data) == (codec.DataRow(values), len(data))


@pytest.mark.parametrize("message", ["", "budget left: ε=9.9, δ=1e-05", "x" * 1000])
def test_notices_encoded_directly_are_the_messages(message: str) -> None:
    data = codec.notice_bytes(message)
    assert data == codec.NoticeResponse.notice(message).encode()
    decoded, used = codec.parse_backend(data)
    assert used == len(data) and isinstance(decoded, codec.NoticeResponse)
    assert decoded.get("M") == message and decoded.get("S") == "NOTICE"
    with pytest.raises(ValueError, match="NUL"):
        codec.notice_bytes("a\x00b")
