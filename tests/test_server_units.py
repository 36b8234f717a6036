"""Server parts without sockets: cancellation gate, parameter types, admin commands,
credentials, the policy's [server] section, the `serve` banner and `analyst passwd`."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dpproxy import cli, errors
from dpproxy.accountant import Cost
from dpproxy.policy import Budget, load_policy
from dpproxy.server import admin, paramtypes
from dpproxy.server.commands import DEMO_PASSWORD, how_to_connect
from dpproxy.server.credentials import CredentialStore
from dpproxy.server.jobs import ChargeGate, Job, QueryCanceled, StatementThreads, install_gate
from dpproxy.server.scram import verify_password
from dpproxy.session import Engine

PolicyFactory = Callable[..., Path]


# jobs: cancel only before the charge ----------------------------------------------------------
class _Ledger:
    def __init__(self) -> None:
        self.charges = 0

    def charge(self, *args: object, **kwargs: object) -> str:
        self.charges += 1
        return "charged"

    def status(self, account: str) -> str:
        return f"status of {account}"


def test_cancel_before_charge_stops_without_charging() -> None:
    ledger = _Ledger()
    gate = ChargeGate(ledger)
    job = Job()
    assert job.try_cancel("canceling statement due to user request")
    with pytest.raises(QueryCanceled) as info:
        job.run(gate.charge, ["analyst:alice"])
    assert info.value.sqlstate == "57014" and ledger.charges == 0


def test_cancel_after_charge_lets_the_statement_finish() -> None:
    ledger = _Ledger()
    gate = ChargeGate(ledger)
    job = Job()
    charged = threading.Event()
    proceed = threading.Event()

    def statement() -> str:
        result = gate.charge(["analyst:alice"])
        charged.set()
        assert proceed.wait(10)
        return result

    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(job.run(statement)))
    worker.start()
    assert charged.wait(10)
    assert not job.try_cancel()  # charged: it runs to the end and is delivered
    proceed.set()
    worker.join(10)
    assert outcome == ["charged"] and ledger.charges == 1


def test_cancel_while_running_stops_at_the_charge() -> None:
    ledger = _Ledger()
    gate = ChargeGate(ledger)
    job = Job()
    analyzing = threading.Event()
    proceed = threading.Event()
    failures: list[BaseException] = []

    def statement() -> str:
        analyzing.set()
        assert proceed.wait(10)
        return gate.charge(["analyst:alice"])

    def work() -> None:
        try:
            job.run(statement)
        except QueryCanceled as exc:
            failures.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    assert analyzing.wait(10)
    assert job.try_cancel()
    proceed.set()
    worker.join(10)
    assert len(failures) == 1 and ledger.charges == 0


def test_statement_threads_deliver_results_and_errors_and_stay_bounded() -> None:
    """Results and exceptions reach the loop's futures; at most max_threads run at once;
    shutdown cancels what has not started and lets what runs finish."""
    threads = StatementThreads(3)
    running, peak, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def work(n: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(10)
        with lock:
            running[0] -= 1
        if n == 7:
            raise ValueError("seven")
        return n * n

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        futures = [threads.submit(loop, work, n) for n in range(10)]
        await _until(lambda: running[0] == 3)  # three run, seven wait
        await asyncio.sleep(0.1)  # (a fourth thread would have started by now)
        release.set()
        return await asyncio.gather(*futures, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert outcomes[:7] == [n * n for n in range(7)] and outcomes[8:] == [64, 81]
    assert isinstance(outcomes[7], ValueError) and str(outcomes[7]) == "seven"
    assert peak[0] == 3

    async def queued_then_shut_down() -> tuple[object, bool]:
        loop = asyncio.get_running_loop()
        gate, started = threading.Event(), [0]

        def busy_work() -> bool:
            with lock:
                started[0] += 1
            return gate.wait(10)

        busy = [threads.submit(loop, busy_work) for _ in range(3)]
        waiting = threads.submit(loop, work, 1)
        await _until(lambda: started[0] == 3)  # every thread busy: `waiting` is queued
        stopper = loop.run_in_executor(None, threads.shutdown)
        await _until(waiting.cancelled)  # not started: cancelled at once, never run
        gate.set()  # what runs finishes
        await stopper
        return await asyncio.gather(*busy), waiting.cancelled()

    finished, cancelled = asyncio.run(queued_then_shut_down())
    assert finished == [True, True, True] and cancelled
    with pytest.raises(RuntimeError):
        asyncio.run(_submit_after(threads))


def test_a_statement_never_waits_behind_another_while_a_thread_can_start() -> None:
    """A new thread counted itself idle before running the work it was started for: after
    one statement the pool believed two threads idle, gave a long statement and then a
    quick one the same thread, and the quick one waited for the long one (a catalog query
    held up everyone's logins)."""
    threads = StatementThreads(4)
    gate = threading.Event()

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        assert await threads.submit(loop, lambda: 1) == 1
        await asyncio.sleep(0.2)  # the thread is back waiting for work
        long = threads.submit(loop, gate.wait, 10)
        quick = threads.submit(loop, lambda: "quick")
        try:
            return await asyncio.wait_for(quick, 5) == "quick" and not long.done()
        finally:
            gate.set()
            await long

    try:
        assert asyncio.run(main())
    finally:
        gate.set()
        threads.shutdown()


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition did not come true within 10 s")


async def _submit_after(threads: StatementThreads) -> None:
    threads.submit(asyncio.get_running_loop(), print)


def test_gate_forwards_everything_else_and_installs_once(demo_policy: Path) -> None:
    gate = ChargeGate(_Ledger())
    assert gate.status("analyst:alice") == "status of analyst:alice"
    assert gate.charge() == "charged"  # outside a job: a plain charge
    with Engine.from_path(demo_policy) as engine:
        install_gate(engine)
        install_gate(engine)
        assert isinstance(engine.ledger, ChargeGate)
        assert not isinstance(engine.ledger._ledger, ChargeGate)


# parameter types --------------------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT COUNT(*) FROM adult WHERE age > $1", [20]),
    ("SELECT COUNT(*) FROM adult WHERE age > $1 AND occupation = $2", [20, 25]),
    ("SELECT COUNT(*) FROM adult a WHERE a.age BETWEEN $1 AND $2", [20, 20]),
    ("SELECT COUNT(*) FROM adult WHERE sex IN ($1, $2)", [25, 25]),
    ("SELECT AVG(amount) FROM visits WHERE day >= $1 AND amount < $2", [1082, 701]),
    ("SELECT $1::float8 AS x, $2::int AS y, $3::date AS d, $4::bool AS b", [701, 23, 1082, 16]),
    ("SELECT COUNT(*) FROM adult LIMIT $1", [20]),
    ("SELECT set_config('jit', $1, false)", [25]),
    ("SELECT $2", [25, 25]),
])
def test_parameter_type_inference(sql: str, expected: list[int]) -> None:
    policy = load_policy(Path(__file__).parents[1] / "policies" / "demo.toml")
    count = paramtypes.count_parameters(sql)
    assert count == len(expected)
    assert paramtypes.infer(sql, count, policy, policy.analyst("alice")) == expected


def test_columns_of_tables_not_granted_give_no_type(make_policy: PolicyFactory) -> None:
    policy = load_policy(make_policy({'tables = ["adult", "visits", "occupation_groups"]':
                                      'tables = ["visits"]'}))
    assert paramtypes.infer("SELECT COUNT(*) FROM adult WHERE age > $1", 1, policy,
                            policy.analyst("alice")) == [25]


# admin commands ----------------------------------------------------------------------------------
def test_admin_command_syntax() -> None:
    assert admin.command("select * from DPPROXY.budgets;").action == "budgets"
    grant = admin.command("CALL dpproxy.grant('alice', 0.5)")
    assert (grant.account, grant.epsilon, grant.delta) == ("analyst:alice", 0.5, 0.0)
    table = admin.command("CALL dpproxy.set_budget('table:adult', 5, 1e-5)")
    assert (table.action, table.account, table.delta) == ("set_budget", "table:adult", 1e-5)
    bound = admin.command("CALL dpproxy.grant($1, $2, $3)", ["alice", 2.0, 0])
    assert (bound.account, bound.epsilon) == ("analyst:alice", 2.0)
    for not_admin in ("SELECT COUNT(*) FROM adult", "SHOW dpproxy.budget",
                      "SET dpproxy.epsilon = 0.5", "SELECT 'dpproxy.budgets'"):
        assert admin.command(not_admin) is None


@pytest.mark.parametrize(("sql", "sqlstate"), [
    ("CALL dpproxy.drop_everything('alice')", "42704"),
    ("CALL dpproxy.grant('alice')", "42601"),
    ("CALL dpproxy.grant(42, 1.0)", "22023"),
    ("CALL dpproxy.grant('alice', 'lots')", "22023"),
    ("SELECT account FROM dpproxy.budgets WHERE account = 'x'", "0A000"),
])
def test_bad_admin_commands(sql: str, sqlstate: str) -> None:
    with pytest.raises(errors.Error) as info:
        admin.command(sql)
    assert info.value.sqlstate == sqlstate


def test_admin_commands_need_the_admin_role(engine: Engine) -> None:
    grant = admin.command("CALL dpproxy.grant('alice', 1.0, 0)")
    with pytest.raises(errors.PrivacyViolation):
        admin.run(grant, engine, "alice", "analyst")
    with pytest.raises(errors.PrivacyViolation):
        admin.describe(grant, "analyst")
    assert engine.ledger.status("analyst:alice").budget == Cost(10.0, 1e-5)
    result = admin.run(grant, engine, "admin", "admin")
    assert result.tag == "CALL" and result.rows[0][:2] == ("analyst:alice", 11.0)
    budgets = admin.run(admin.command("SELECT * FROM dpproxy.budgets"), engine, "admin", "admin")
    assert ("analyst:alice", 11.0) in [row[:2] for row in budgets.rows]
    changed = admin.run(admin.command("CALL dpproxy.set_budget('alice', 5, 1e-6)"), engine,
                        "admin", "admin")
    assert changed.rows[0][1] == 5.0 and changed.rows[0][4] == 1e-6
    assert engine.ledger.admin_history("analyst:alice")[0].by == "analyst:admin"


# credentials --------------------------------------------------------------------------------------
def test_credentials_policy_then_ledger(demo_policy: Path) -> None:
    policy = load_policy(demo_policy)
    store = CredentialStore(policy)
    assert verify_password(DEMO_PASSWORD, store.verifier("alice") or "")
    assert store.verifier("admin") is None and store.verifier("mallory") is None
    store.set_password("alice", "n3w password")
    stored = store.verifier("alice") or ""
    assert verify_password("n3w password", stored) and not verify_password(DEMO_PASSWORD, stored)
    with sqlite3.connect(policy.ledger_path) as db:
        rows = db.execute("SELECT analyst, verifier FROM credentials").fetchall()
    assert rows == [("alice", stored)]
    assert "n3w" not in policy.ledger_path.read_bytes().decode("latin-1")
    with Engine(policy) as engine:  # the ledger still opens with the extra table
        assert engine.ledger.status("analyst:alice").budget.epsilon == 10.0
    with pytest.raises(errors.UndefinedObject):
        store.set_password("mallory", "x")


def test_analyst_passwd_command(demo_policy: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("admin-secret\n"))
    assert cli.main(["analyst", "passwd", "--policy", str(demo_policy), "admin",
                     "--password-stdin"]) == 0
    out = capsys.readouterr().out
    assert "password set for admin" in out and "admin-secret" not in out
    assert verify_password("admin-secret",
                           CredentialStore(load_policy(demo_policy)).verifier("admin") or "")
    passwords = iter(["one", "two"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(passwords))
    assert cli.main(["analyst", "passwd", "--policy", str(demo_policy), "admin"]) == 1
    assert "do not match" in capsys.readouterr().err


def test_analyst_add_and_remove_edit_the_policy_file(
        demo_policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """add appends an [analysts.<name>] table, remove deletes it; every other line, comments
    included, stays as it was, and the file always loads."""
    before = demo_policy.read_text() + "\n# a closing comment\n"
    demo_policy.write_text(before)
    assert cli.main(["analyst", "add", "--policy", str(demo_policy), "bob",
                     "--tables", "adult, visits", "--epsilon", "2", "--delta", "1e-6"]) == 0
    assert "takes it at the next login" in capsys.readouterr().out
    bob = load_policy(demo_policy).analysts["bob"]
    assert (bob.role, bob.tables, bob.budget) == ("analyst", ("adult", "visits"),
                                                  Budget(2.0, 1e-6))
    assert demo_policy.read_text().startswith(before.rstrip("\n"))
    with Engine.from_path(demo_policy) as engine:  # bob can query, with his own budget
        session = engine.session("bob")
        assert session.execute("SELECT COUNT(*) FROM adult").rows
        assert session.remaining().epsilon < 2.0
    assert cli.main(["analyst", "add", "--policy", str(demo_policy), "bob"]) == 1
    assert "already" in capsys.readouterr().err
    assert cli.main(["analyst", "add", "--policy", str(demo_policy), "eve",
                     "--tables", "nope", "--epsilon", "1"]) == 1
    assert "nope" in capsys.readouterr().err
    # alice is written mid-file, with a multi-line value: the tables after her stay
    text = demo_policy.read_text().replace(
        'tables = ["adult", "visits", "occupation_groups"]\n',
        'tables = [\n  "adult",\n  "visits",\n  "occupation_groups",\n]\n', 1)
    assert text != demo_policy.read_text()
    demo_policy.write_text(text)
    assert cli.main(["analyst", "remove", "--policy", str(demo_policy), "alice"]) == 0
    after = load_policy(demo_policy)
    assert "alice" not in after.analysts and {"bob", "admin"} <= set(after.analysts)
    assert "[analysts.alice]" not in demo_policy.read_text()
    assert "# a closing comment" in demo_policy.read_text()
    assert cli.main(["analyst", "remove", "--policy", str(demo_policy), "alice"]) == 1
    assert "not in policy" in capsys.readouterr().err
    # an analyst written as an inline table, not as its own [analysts.NAME], is left to
    # the hand
    inline = demo_policy.read_text() + '\n[analysts]\ncarol = { role = "admin" }\n'
    demo_policy.write_text(inline)
    assert "carol" in load_policy(demo_policy).analysts
    assert cli.main(["analyst", "remove", "--policy", str(demo_policy), "carol"]) == 1
    assert "by hand" in capsys.readouterr().err
    assert demo_policy.read_text() == inline


# policy [server] --------------------------------------------------------------------------------
def test_server_section_defaults_and_values(make_policy: PolicyFactory) -> None:
    policy = load_policy(make_policy())
    assert (policy.server.host, policy.server.port) == ("127.0.0.1", 6432)
    custom = load_policy(make_policy({"port = 6432": "port = 7000\ntls_cert = \"c.pem\"\n"
                                                     "tls_key = \"k.pem\"\nrequire_tls = true"}))
    assert custom.server.port == 7000 and custom.server.require_tls
    assert custom.server.tls_cert == custom.path.parent / "c.pem"


@pytest.mark.parametrize(("snippet", "field"), [
    ("port = 70000", "server.port"),
    ("port = \"6432\"", "server.port"),
    ("port = 6432\ntls_cert = \"c.pem\"", "server.tls_key"),
    ("max_connections = 100\nmax_connections_typo = 1", "server.max_connections_typo"),
    ("max_connections = 0", "server.max_connections"),
    ("statement_timeout_s = -1", "server.statement_timeout_s"),
    ("trust_loopback = \"yes\"", "server.trust_loopback"),
])
def test_server_section_errors_name_file_and_field(make_policy: PolicyFactory, snippet: str,
                                                   field: str) -> None:
    key = snippet.split(" = ")[0]
    original = {"port": "port = 6432", "max_connections": "max_connections = 100",
                "statement_timeout_s": "statement_timeout_s = 300",
                "trust_loopback": "trust_loopback = false"}[key]
    path = make_policy({original: snippet})
    with pytest.raises(errors.InvalidPolicy) as info:
        load_policy(path)
    assert str(path) in info.value.message and field in info.value.message


def test_serve_banner_shows_the_demo_password_only_for_the_demo(
        make_policy: PolicyFactory) -> None:
    policy = load_policy(make_policy())
    banner = how_to_connect(policy, policy.server, 6543)
    assert 'psql "postgresql://alice@127.0.0.1:6543/demo"' in banner
    assert f"password: {DEMO_PASSWORD}" in banner
    other = load_policy(make_policy({"password_scram = ": "# password_scram = "}))
    banner = how_to_connect(other, other.server, 6543)
    assert DEMO_PASSWORD not in banner and "dpproxy analyst passwd alice" in banner
