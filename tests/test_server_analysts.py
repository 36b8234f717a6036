"""Analysts added, removed and given passwords while the server runs: over the wire (an
admin's CALL dpproxy.add_analyst / remove_analyst, ALTER ROLE … PASSWORD, psql's
\\password) and by `dpproxy analyst add` on the policy file. Real psycopg and psql over
real sockets, on the demo policy."""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import replace

import psycopg
import pytest

from dpproxy import errors
from dpproxy.cli import main as cli
from dpproxy.policy import load_policy
from dpproxy.server import admin, codec
from dpproxy.server.scram import make_verifier
from dpproxy.session import Engine

from .test_server_support import (
    ADMIN_PASSWORD,
    PASSWORD,
    Served,
    ServeFactory,
    admin_policy_snippet,
    raw_clients,
)

ACCEPTED = "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation"
ADD_BOB = "CALL dpproxy.add_analyst('bob', ARRAY['adult'], 2.0, 1e-6)"


def _admin(served: Served) -> psycopg.Connection:
    return psycopg.connect(served.dsn("admin", ADMIN_PASSWORD), autocommit=True)


def _audit(served: Served) -> str:
    assert served.engine.audit.path is not None
    return served.engine.audit.path.read_text()


def test_an_added_analyst_logs_in_and_queries(serve: ServeFactory) -> None:
    """add_analyst writes the policy file and answers with the new account; a password set
    by ALTER ROLE lets bob in at once, on the tables granted; bob may change his own
    password but no one else's, and no budget command. No password reaches the audit log."""
    served = serve(admin_policy_snippet())
    with _admin(served) as conn:
        (row,) = conn.execute(ADD_BOB).fetchall()
        assert row[:5] == ("analyst:bob", 2.0, 0.0, 2.0, 1e-6)
        cur = conn.execute("ALTER ROLE bob WITH PASSWORD 'bob-secret'")
        assert cur.statusmessage == "ALTER ROLE" and cur.description is None
    text = served.policy_path.read_text()
    assert '[analysts.bob]\nbudget = { epsilon = 2.0, delta = 1e-06 }\ntables = ["adult"]' \
        in text
    with psycopg.connect(served.dsn("bob", "bob-secret"), autocommit=True) as bob:
        assert len(bob.execute(ACCEPTED).fetchall()) == 14
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("SELECT COUNT(*) FROM visits")  # not granted
        bob.execute("ALTER USER CURRENT_USER PASSWORD 'bob-first'")  # his own
        bob.execute("ALTER USER bob PASSWORD 'bob-second'")
        for other in ("ALTER ROLE alice PASSWORD 'mine-now'", ADD_BOB.replace("bob", "eve"),
                      "CALL dpproxy.remove_analyst('alice')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                bob.execute(other)
    assert served.spent("bob") > 0
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(served.dsn("bob", "bob-secret"))
    psycopg.connect(served.dsn("bob", "bob-second")).close()
    psycopg.connect(served.dsn()).close()  # alice's password stands
    audit = _audit(served)
    assert not any(word in audit for word in ("bob-secret", "bob-first", "bob-second",
                                              "mine-now"))
    assert audit.count("(statement not logged: it sets a password)") == 4
    assert "dpproxy.add_analyst('bob'" in audit


def test_a_removed_analyst_is_cut_off(serve: ServeFactory) -> None:
    """remove_analyst ends bob's open connections at their next statement (FATAL 28000),
    a prepared statement's next run (Bind, no Parse) included, and nothing more is charged;
    his logins are refused; the ledger keeps his account; a later bob does not inherit his
    password. An admin cannot remove themself."""
    served = serve(admin_policy_snippet())
    with _admin(served) as conn:
        conn.execute(ADD_BOB)
        conn.execute("ALTER ROLE bob PASSWORD 'bob-secret'")
        bob = psycopg.connect(served.dsn("bob", "bob-secret"), autocommit=True)
        prepared = psycopg.connect(served.dsn("bob", "bob-secret"), autocommit=True)
        bob.execute(ACCEPTED).fetchall()
        prepared.execute(ACCEPTED, prepare=True).fetchall()  # a named statement: its later
        (row,) = conn.execute("CALL dpproxy.remove_analyst('bob')").fetchall()  # runs Bind
        assert row[0] == "analyst:bob" and row[2] > 0  # spent stays on record
        spent = served.spent("bob")
        for client in (bob, prepared):
            with pytest.raises(psycopg.OperationalError) as gone:
                client.execute(ACCEPTED, prepare=client is prepared)
            assert gone.value.sqlstate == "28000"
            assert "removed from the policy" in str(gone.value)
            assert client.closed or client.broken
        assert served.spent("bob") == spent  # nothing more was charged
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(served.dsn("bob", "bob-secret"))
        assert "[analysts.bob]" not in served.policy_path.read_text()
        with pytest.raises(psycopg.errors.ObjectInUse):
            conn.execute("CALL dpproxy.remove_analyst('admin')")
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("CALL dpproxy.remove_analyst('bob')")
        conn.execute(ADD_BOB)  # again: a new bob, with no password yet
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(served.dsn("bob", "bob-secret"))
    assert served.engine.ledger.status("analyst:bob").spent.epsilon > 0


ALICE = ('budget = { epsilon = 10.0, delta = 1e-5 }\n'
         'tables = ["adult", "visits", "occupation_groups"]')


def test_grants_and_role_follow_the_policy_file(serve: ServeFactory,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Editing alice's tables in the policy file revokes visits from her open connection's
    next statement: a new value of a prepared shape, and the exact repeat of an answered
    query, are refused (42501) and charge nothing, while adult still answers. Granting it
    back with role = "admin" lets the same connection run an admin command. A budget edited
    in the file is logged and left: the ledger's budget stands."""
    served = serve()
    shape = "SELECT COUNT(*) FROM visits WHERE amount > %s"
    with psycopg.connect(served.dsn(), autocommit=True) as alice:
        alice.execute(shape, [10], prepare=True).fetchall()
        alice.execute("SELECT COUNT(*) FROM visits").fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute(ADD_BOB)
        text = served.policy_path.read_text()
        assert ALICE in text
        served.policy_path.write_text(text.replace(ALICE, ALICE.replace(
            "10.0", "50.0").replace('"visits", ', "")))
        spent = served.spent()
        for sql, params in ((shape, [20]), ("SELECT COUNT(*) FROM visits", None)):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                alice.execute(sql, params, prepare=params is not None)
            assert "visits" in str(refused.value)
        assert served.spent() == spent
        alice.execute("SELECT COUNT(*) FROM adult").fetchall()
        assert served.spent() > spent
        assert served.engine.ledger.status("analyst:alice").budget.epsilon == 10.0
        assert "the budget of analyst alice changed in the file" in caplog.text

        served.policy_path.write_text(text.replace(ALICE, f'{ALICE}\nrole = "admin"'))
        alice.execute(shape, [30], prepare=True).fetchall()
        (row,) = alice.execute(ADD_BOB).fetchall()
        assert row[0] == "analyst:bob"


def test_a_revocation_applies_while_other_edits_wait(serve: ServeFactory,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An edit outside the analysts (a privacy default) waits for a restart; a revocation
    made with it, or after it, still applies from the next statement. (It was dropped
    with the rest until the restart, a review found: the revoked analyst kept reading.)"""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as alice:
        alice.execute("SELECT COUNT(*) FROM visits").fetchall()
        text = served.policy_path.read_text()
        pending = text.replace("default_epsilon = 0.1 ", "default_epsilon = 0.3 ")
        assert pending != text and ALICE in text
        with caplog.at_level(logging.WARNING, logger="dpproxy"):
            served.policy_path.write_text(pending)
            alice.execute("SELECT COUNT(*) FROM adult").fetchall()
            assert "restart to apply the rest" in caplog.text
        served.policy_path.write_text(pending.replace(ALICE, ALICE.replace('"visits", ', "")))
        spent = served.spent()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT COUNT(*) FROM visits WHERE amount > 3")
        assert served.spent() == spent
        assert served.engine.policy.privacy.default_epsilon == 0.1


def test_a_portal_bound_before_a_revocation_is_refused(serve: ServeFactory) -> None:
    """Parse and Bind while granted, Execute after the revocation: refused (42501), as a
    new statement is, and nothing charged."""
    served = serve()
    for connect in raw_clients(served):
        client = connect()
        client.send(codec.Parse("", "SELECT COUNT(*) FROM visits WHERE amount > 21"),
                    codec.Bind("", "", (), (), ()), codec.Flush())
        assert isinstance(client.until(codec.BindComplete)[-1], codec.BindComplete)
        text = served.policy_path.read_text()
        served.policy_path.write_text(text.replace(ALICE, ALICE.replace('"visits", ', "")))
        spent = served.spent()
        client.send(codec.Execute("", 0), codec.Sync())
        replies = client.until(codec.ReadyForQuery)
        errors_ = [m for m in replies if isinstance(m, codec.ErrorResponse)]
        assert errors_ and dict(errors_[0].fields)["C"] == "42501", replies
        assert not any(isinstance(m, codec.DataRow) for m in replies)
        assert served.spent() == spent


def test_a_shape_stored_across_a_revocation_is_not_trusted(engine: Engine) -> None:
    """A query analysed while its table was being revoked may store its accepted shape
    after the new grants apply: a later query of that shape is analysed again, and
    refused, rather than planned from the stored shape."""
    alice = engine.session("alice", epsilon=1.0)
    shape = "SELECT COUNT(*) FROM visits WHERE amount > %s"
    alice.execute(shape, (10,))
    revoked = replace(engine.policy.analysts["alice"], tables=("adult",))
    # the state such a race leaves: the new grants, the old shape still stored
    engine.policy = replace(engine.policy,
                            analysts={**engine.policy.analysts, "alice": revoked})
    spent = engine.ledger.status("analyst:alice").spent.epsilon
    with pytest.raises(errors.PrivacyViolation) as refused:
        alice.execute(shape, (20,))
    assert refused.value.sqlstate == "42501" and "visits" in str(refused.value)
    assert engine.ledger.status("analyst:alice").spent.epsilon == spent


def test_an_answered_text_is_not_repeated_across_a_revocation(engine: Engine) -> None:
    """A repeat of an answered text is served from the stored answers before analysis, by
    its remembered output names. Once visits is revoked (the engine's grants changed
    directly: nothing was dropped), the repeat is analysed again and refused; granted
    back, it is the stored answer again, free."""
    alice = engine.session("alice", epsilon=1.0)
    sql = "SELECT COUNT(*) FROM visits"
    first = alice.execute(sql).rows
    granted = engine.policy.analysts["alice"]
    spent = engine.ledger.status("analyst:alice").spent.epsilon
    engine.policy = replace(engine.policy, analysts={
        **engine.policy.analysts, "alice": replace(granted, tables=("adult",))})
    with pytest.raises(errors.PrivacyViolation) as refused:
        alice.execute(sql)
    assert "visits" in str(refused.value)
    engine.policy = replace(engine.policy, analysts={**engine.policy.analysts,
                                                     "alice": granted})
    assert alice.execute(sql).rows == first
    assert engine.ledger.status("analyst:alice").spent.epsilon == spent


def test_concurrent_adds_are_all_kept(serve: ServeFactory) -> None:
    """16 admin connections adding 3 analysts each at once: all 48 are in the policy file
    and served (each edit reads, checks and replaces the file under the folder's lock)."""
    served = serve(admin_policy_snippet())
    failures: list[BaseException] = []

    def add(i: int) -> None:
        try:
            with _admin(served) as conn:
                for j in range(3):
                    conn.execute(f"CALL dpproxy.add_analyst('a{i}_{j}', 'adult', 1.0)")
        except BaseException as exc:  # reported below, with the others
            failures.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:3]
    wanted = {f"a{i}_{j}" for i in range(16) for j in range(3)}
    assert wanted <= set(load_policy(served.policy_path).analysts)
    served.engine.refresh_analysts()
    assert wanted <= set(served.engine.policy.analysts)


def test_admin_analyst_commands_are_checked(serve: ServeFactory) -> None:
    """Bad calls change nothing: wrong arity (42601), an unknown table (42704), a name
    already there (22023), a role that does not exist (22023), an ALTER ROLE that does more
    than set a password (0A000, and its password is not logged either)."""
    served = serve(admin_policy_snippet())
    before = served.policy_path.read_text()
    with _admin(served) as conn:
        for sql, error in [
            ("CALL dpproxy.add_analyst('bob', ARRAY['adult'])", psycopg.errors.SyntaxError),
            ("CALL dpproxy.add_analyst('bob', 'adult,nope', 1.0)",
             psycopg.errors.UndefinedObject),
            ("CALL dpproxy.add_analyst('alice', 'adult', 1.0)",
             psycopg.errors.InvalidParameterValue),
            ("CALL dpproxy.add_analyst('bob', 'adult', 1.0, 0, 'root')",
             psycopg.errors.InvalidParameterValue),
            ("CALL dpproxy.add_analyst('bob', 42, 1.0)", psycopg.errors.InvalidParameterValue),
            ("ALTER ROLE alice WITH LOGIN PASSWORD 'leaked?'",
             psycopg.errors.FeatureNotSupported),
            ("ALTER ROLE alice PASSWORD ''", psycopg.errors.InvalidParameterValue),
            ("ALTER ROLE nobody PASSWORD 'x'", psycopg.errors.UndefinedObject),
            # apart from alice by case or spaces alone: ALTER ROLE Alice would reach alice
            ("CALL dpproxy.add_analyst('Alice', 'adult', 1.0)",
             psycopg.errors.InvalidParameterValue),
            ("CALL dpproxy.add_analyst('alice ', 'adult', 1.0)",
             psycopg.errors.InvalidParameterValue),
        ]:
            with pytest.raises(error):
                conn.execute(sql)
        with pytest.raises(psycopg.errors.ConfigFileError) as refused:  # tables, no budget
            conn.execute("CALL dpproxy.add_analyst('bob', 'adult', NULL)")
        assert "needs a budget" in str(refused.value) and served.policy_path.name in str(
            refused.value) and ".toml." not in str(refused.value)  # not the scratch file
        assert served.policy_path.read_text() == before
        # tables given as text; an admin without tables or a budget
        conn.execute("CALL dpproxy.add_analyst('carol', 'adult, visits', 1.5)")
        conn.execute("CALL dpproxy.add_analyst('root', NULL, NULL, 0, 'admin')")
    assert served.policy_path.read_text().startswith(before)
    assert "leaked?" not in _audit(served)
    carol, root = (served.engine.policy.analysts[a] for a in ("carol", "root"))
    assert (carol.role, carol.tables, carol.budget.epsilon) == ("analyst", ("adult", "visits"),
                                                               1.5)
    assert (root.role, root.tables, root.budget) == ("admin", (), None)


def test_a_refused_add_keeps_the_analyst_s_password(serve: ServeFactory) -> None:
    """add_analyst of a name already there is refused, and alice's password (changed by
    herself) still logs in: the stored one was not forgotten before the refusal (it was,
    a review found, bringing the policy's older password back). A password statement
    spelt with a non-ASCII letter is not one (as in PostgreSQL), and is not logged."""
    served = serve(admin_policy_snippet())
    with psycopg.connect(served.dsn(), autocommit=True) as alice:
        alice.execute("ALTER ROLE CURRENT_USER PASSWORD 'alice-new'")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            alice.execute("ALTER ROLE alice pa\u017f\u017fword 'TopSecret-1'")
    with _admin(served) as conn, pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("CALL dpproxy.add_analyst('alice', NULL, 1)")
    psycopg.connect(served.dsn(password="alice-new")).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(served.dsn(password=PASSWORD))
    assert "TopSecret-1" not in _audit(served)


def test_the_cli_reaches_a_running_server(serve: ServeFactory,
                                          monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """`dpproxy analyst add` and `passwd` on the policy file of a running server: dan logs
    in without a restart, and `remove` cuts him off; a new `password_scram` is taken too.
    A hand edit beyond the analysts is not applied (logged: restart), nor is a file that
    no longer loads; the analysts served stay as they were, and so does the version stored
    answers are kept under."""
    served = serve()
    path = str(served.policy_path)
    assert cli(["analyst", "add", "--policy", path, "dan", "--tables", "adult",
                "--epsilon", "1"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("dan-secret\n"))
    assert cli(["analyst", "passwd", "--policy", path, "dan", "--password-stdin"]) == 0
    with psycopg.connect(served.dsn("dan", "dan-secret"), autocommit=True) as dan:
        assert len(dan.execute(ACCEPTED).fetchall()) == 14
    assert served.engine.ledger.status("analyst:dan").budget.epsilon == 1.0
    version = served.engine.policy.version
    text = served.policy_path.read_text()
    with caplog.at_level(logging.WARNING, logger="dpproxy"):
        assert "default_epsilon = 0.1 " in text
        served.policy_path.write_text(text.replace("default_epsilon = 0.1 ",
                                                   "default_epsilon = 0.3 "))
        served.engine.refresh_analysts()
        assert "restart to apply" in caplog.text
        served.policy_path.write_text(text + "\n[analysts.broken\n")
        served.engine.refresh_analysts()
        assert "does not load" in caplog.text
    assert served.engine.policy.privacy.default_epsilon == 0.1
    assert set(served.engine.policy.analysts) == {"alice", "admin", "dan"}
    assert served.engine.policy.version == version
    # a new verifier in the policy is taken (how a PostgreSQL ledger's passwords change)
    served.policy_path.write_text(text.replace(
        'password_scram = "SCRAM', '# password_scram = "SCRAM').replace(
        '[analysts.alice]\n', f'[analysts.alice]\npassword_scram = "{make_verifier("new")}"\n'))
    psycopg.connect(served.dsn(password="new")).close()
    served.policy_path.write_text(text)
    assert cli(["analyst", "remove", "--policy", path, "dan"]) == 0
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(served.dsn("dan", "dan-secret"))
    assert set(served.engine.policy.analysts) == {"alice", "admin"}


needs_psql = pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")


@needs_psql
def test_psql_password_command(serve: ServeFactory) -> None:
    """psql's \\password: it asks SHOW password_encryption, makes a SCRAM-SHA-256 verifier
    itself and sends ALTER USER … PASSWORD '<verifier>'; the verifier is stored as it is,
    so alice logs in with the new password and no longer with the old one."""
    served = serve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env |= {"PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "10", "PGSSLMODE": "disable"}
    conninfo = f"host=127.0.0.1 port={served.port} user=alice dbname=demo"
    # without a controlling terminal psql reads the new password from standard input
    done = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", conninfo, "-c",
                           r"\password"], env=env, input="alice-next\nalice-next\n",
                          capture_output=True, text=True, timeout=60, start_new_session=True)
    assert done.returncode == 0, done.stderr
    psycopg.connect(served.dsn(password="alice-next")).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(served.dsn())
    assert "alice-next" not in _audit(served)


def test_alter_role_parsing() -> None:
    """What admin.command makes of ALTER statements: PostgreSQL's name folding, WITH,
    a parameter, and None for an ALTER that sets no password."""
    cases = {"ALTER ROLE Bob PASSWORD 'x'": "bob", 'ALTER USER "Bob" WITH PASSWORD \'x\'': "Bob",
             "alter role bob password 'x'": "bob"}
    for sql, name in cases.items():
        cmd = admin.command(sql)
        assert cmd is not None and (cmd.action, cmd.analyst, cmd.password) == \
            ("password", name, "x")
        assert "x'" not in repr(cmd) and "password='x'" not in repr(cmd)
    cmd = admin.command("ALTER ROLE bob PASSWORD $1", ["p1"])
    assert cmd is not None and cmd.password == "p1"
    cmd = admin.command("ALTER ROLE current_user PASSWORD 'x'")
    assert cmd is not None and cmd.analyst == ""  # the analyst asking, resolved by run()
    assert admin.command("ALTER ROLE bob RENAME TO carl") is None
    assert admin.command("ALTER TABLE adult ADD COLUMN x int") is None
    with pytest.raises(errors.NotSupportedError):
        admin.command("ALTER ROLE bob PASSWORD 'x' VALID UNTIL '2030-01-01'")
    verifier = make_verifier("pw")
    cmd = admin.command(f"ALTER USER bob PASSWORD '{verifier}'")
    assert cmd is not None and cmd.password == verifier
