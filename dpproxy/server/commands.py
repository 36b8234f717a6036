"""`dpproxy serve` and `dpproxy analyst passwd`, registered into the CLI's parser."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from .. import errors
from ..accountant import AccountStatus
from ..policy import Policy, ServerSettings, load_policy

# The bundled demo policy stores a verifier of this password for alice (and only a
# verifier): `serve` prints it when the policy's verifier matches, so it never goes stale.
DEMO_PASSWORD = "alice-demo"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             with_policy: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the server's subcommands to the `dpproxy` parser."""
    s = sub.add_parser("serve", help="serve the PostgreSQL protocol: connect with psql, "
                                     "psycopg, asyncpg, SQLAlchemy, JDBC, ODBC, BI tools")
    with_policy(s)
    s.add_argument("--host", help="listen address (default: the policy's, else 127.0.0.1)")
    s.add_argument("--port", type=int, help="listen port (default: the policy's, else 6432)")
    s.add_argument("--tls-cert", type=Path, help="TLS certificate (PEM)")
    s.add_argument("--tls-key", type=Path, help="TLS private key (PEM)")
    s.add_argument("--log-level", default="INFO",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    s.add_argument("--workers", default="1",
                   help="server processes sharing the port and the ledger: a number, or "
                        "auto for one per core on Linux (default: 1)")
    s.set_defaults(func=cmd_serve)

    a = sub.add_parser("analyst", help="analyst accounts")
    asub = a.add_subparsers(dest="analyst_command", required=True, metavar="ACTION")
    p = asub.add_parser("passwd", help="set an analyst's password for `serve` (stored only as "
                                       "a SCRAM-SHA-256 verifier)")
    with_policy(p)
    p.add_argument("name", help="the analyst")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of standard input")
    p.set_defaults(func=cmd_passwd)
    add = asub.add_parser("add", help="add an analyst to the policy file")
    with_policy(add)
    add.add_argument("name", help="the analyst")
    add.add_argument("--tables", default="", help="tables it may query, comma-separated")
    add.add_argument("--epsilon", type=float, help="its ε budget (none: it cannot query)")
    add.add_argument("--delta", type=float, default=0.0, help="its δ budget (default: 0)")
    add.add_argument("--role", default="analyst", choices=("analyst", "admin"))
    add.set_defaults(func=cmd_add)
    remove = asub.add_parser("remove", help="remove an analyst from the policy file (the "
                                            "ledger keeps its history)")
    with_policy(remove)
    remove.add_argument("name", help="the analyst")
    remove.set_defaults(func=cmd_remove)


def how_to_connect(policy: Policy, settings: ServerSettings, port: int) -> str:
    """What `serve` prints: a psql command line and, for the demo, its password."""
    from .scram import verify_password

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    analysts = [a for a in policy.analysts.values() if a.role != "admin" and a.tables] \
        or list(policy.analysts.values())
    analyst = analysts[0]
    tls = "?sslmode=require" if settings.tls_cert is not None else ""
    lines = [f"dpproxy is serving database \"{policy.database}\" on {settings.host}:{port}.",
             "Connect with:", "",
             f"  psql \"postgresql://{analyst.name}@{host}:{port}/{policy.database}{tls}\"", ""]
    verifier = analyst.password_scram
    if verifier is not None and verify_password(DEMO_PASSWORD, verifier):
        lines.append(f"password: {DEMO_PASSWORD}  (the demo password of {analyst.name})")
    elif settings.trust_loopback:
        lines.append("no password needed from this machine (server.trust_loopback)")
    else:
        lines.append(f"set a password first: dpproxy analyst passwd {analyst.name}")
    if "adult" in analyst.tables:
        lines += ["", "Then try:  SELECT occupation, COUNT(*) FROM adult GROUP BY occupation;"]
    lines.append("Stop with Ctrl-C.")
    return "\n".join(lines)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..session import Engine
    from .server import make_ssl_context, serve, settings_with

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policy = load_policy(args.policy)
    settings = settings_with(policy, args.host, args.port, args.tls_cert, args.tls_key)
    make_ssl_context(settings)  # a bad certificate fails before anything is built
    backend = policy.backend
    if backend.demo_seed is not None and backend.path is not None and not backend.path.exists():
        from ..demo import ensure_demo

        ensure_demo(backend.path, seed=backend.demo_seed,
                    progress=lambda message: print(f"demo: {message}", file=sys.stderr))
    from .workers import parse_workers, serve_workers

    workers = parse_workers(args.workers)
    if workers > 1:
        Engine(policy).close()  # the ledger and backend open (and are created) before workers
        return serve_workers(policy.path, settings, workers,
                             lambda port: print(how_to_connect(policy, settings, port),
                                                flush=True))
    with Engine(policy) as engine:
        def announce(server: object) -> None:
            print(how_to_connect(policy, settings, getattr(server, "port", settings.port)),
                  flush=True)

        serve(engine, settings, announce)
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from ..policy_edit import add_analyst, table_names
    from .credentials import CredentialStore

    # a password left by an earlier analyst of that name (removed by hand) lets no one in
    policy = load_policy(args.policy)
    store = CredentialStore(policy)
    kept = _kept_account(policy, args.name)
    add_analyst(args.policy, args.name, table_names(args.tables), args.epsilon, args.delta,
                args.role, lambda: store.forget(args.name))
    print(f"analyst {args.name} added to {args.policy} (a running `dpproxy serve` takes it "
          f"at the next login); set a password: dpproxy analyst passwd {args.name}")
    if kept is not None:
        print(f"the ledger keeps {args.name}'s earlier account, and its budget: "
              f"ε={kept.budget.epsilon:g}, δ={kept.budget.delta:g}, spent "
              f"ε={kept.spent.epsilon:g}; the policy's budget applies to new accounts only "
              f"(change it: dpproxy budget set {args.name} --epsilon …)")
    return 0


def _kept_account(policy: Policy, name: str) -> AccountStatus | None:
    """The ledger's account of an analyst of this name removed earlier, if it keeps one."""
    from ..session import analyst_account, open_ledger

    try:
        with open_ledger(policy) as ledger:
            return next((s for s in ledger.statuses() if s.account == analyst_account(name)),
                        None)
    except errors.Error:  # the ledger cannot be read now: adding the analyst still works
        return None


def cmd_remove(args: argparse.Namespace) -> int:
    from ..policy_edit import remove_analyst
    from .credentials import CredentialStore

    store = CredentialStore(load_policy(args.policy))
    remove_analyst(args.policy, args.name)
    store.forget(args.name)
    print(f"analyst {args.name} removed from {args.policy}, with its password (a running "
          "`dpproxy serve` ends its connections at their next statement; the ledger keeps "
          "its account and history)")
    return 0


def cmd_passwd(args: argparse.Namespace) -> int:
    from .credentials import CredentialStore

    policy = load_policy(args.policy)
    if args.name not in policy.analysts:
        raise errors.UndefinedObject(f"analyst {args.name!r} is not in policy "
                                     f"{policy.path.name}",
                                     hint=f"analysts: {', '.join(sorted(policy.analysts))}")
    CredentialStore(policy).check_writable(args.name)  # before asking for the password
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"New password for {args.name}: ")
        if getpass.getpass("Again: ") != password:
            raise errors.InterfaceError("the passwords do not match; nothing was changed")
    CredentialStore(policy).set_password(args.name, password)
    print(f"password set for {args.name} (stored as a SCRAM-SHA-256 verifier in "
          f"{policy.ledger_path.name})")
    return 0
