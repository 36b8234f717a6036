"""Runs a script of statements through psqlODBC with pyodbc, as an ODBC application would:
tests/test_odbc.py feeds it JSON commands on stdin and reads one JSON line per command.

    python odbc_script.py <port> <user> <password> < script

It runs in a process of its own, whose environment names the driver (ODBCSYSINI) and,
where the driver was unpacked into .venv, its libraries (LD_LIBRARY_PATH).

Commands: {"query": sql, "params": [...], "times": n} runs sql n times on one cursor (a
parameter {"date": "YYYY-MM-DD"} is a datetime.date); {"tables": true} and {"columns":
table} are SQLTables and SQLColumns; {"autocommit": bool} and {"commit": true} set the
connection's. Each prints {"columns": [...], "rows": [[...]]} (values as JSON, dates as
ISO text), {"ok": true}, or {"error": SQLSTATE, "message": …}.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import pyodbc


def value(v: Any) -> Any:
    return v.isoformat() if isinstance(v, dt.date) else v


def parameter(p: Any) -> Any:
    return dt.date.fromisoformat(p["date"]) if isinstance(p, dict) else p


def rows_of(cursor: pyodbc.Cursor) -> dict[str, Any]:
    return {"columns": [d[0] for d in cursor.description],
            "rows": [[value(v) for v in row] for row in cursor.fetchall()]}


def run(conn: pyodbc.Connection, cursor: pyodbc.Cursor, command: dict[str, Any]
        ) -> dict[str, Any]:
    if "query" in command:
        out: dict[str, Any] = {}
        for _ in range(command.get("times", 1)):
            cursor.execute(command["query"], *map(parameter, command.get("params", [])))
            out = rows_of(cursor) if cursor.description else {"ok": True}
        return out
    if "tables" in command:
        return {"rows": [[t.table_name] for t in cursor.tables(tableType="TABLE")]}
    if "columns" in command:
        return {"rows": [[c.column_name, c.type_name]
                         for c in cursor.columns(table=command["columns"])]}
    if "autocommit" in command:
        conn.autocommit = command["autocommit"]
        return {"ok": True}
    if "commit" in command:
        conn.commit()
        return {"ok": True}
    raise ValueError(f"unknown command {command}")


def main() -> None:
    port, user, password = sys.argv[1:4]
    conn = pyodbc.connect(f"DRIVER={{PostgreSQL Unicode}};SERVER=127.0.0.1;PORT={port};"
                          f"DATABASE=demo;UID={user};PWD={password};SSLmode=disable",
                          autocommit=True)
    cursor = conn.cursor()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = run(conn, cursor, json.loads(line))
        except pyodbc.Error as exc:
            out = {"error": exc.args[0], "message": str(exc.args[-1]).split("\n")[0]}
        print(json.dumps(out), flush=True)
    conn.close()


if __name__ == "__main__":
    main()
