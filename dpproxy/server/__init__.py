"""The PostgreSQL wire-protocol server: any PostgreSQL client talks to dpproxy unchanged.

Modules, from the bytes up (the session below knows nothing of the wire):

| module | what |
| --- | --- |
| `codec` | bytes ⇄ message dataclasses, value formats; no sockets |
| `scram` | SCRAM-SHA-256 server side over stored verifiers |
| `credentials` | where verifiers live (policy, or the ledger file) |
| `paramtypes` | types of `$n` parameters a client did not declare |
| `catalog` | pg_catalog / information_schema answers generated from the policy |
| `admin` | budget administration as SQL, for analysts with role admin |
| `cursors` | DECLARE / FETCH / MOVE / CLOSE over an answered query's rows |
| `jobs` | off-loop execution and cancellation that never releases without a charge |
| `connection` | one client: startup, authentication, simple and extended query |
| `server` | the asyncio listener, limits, shutdown; `BackgroundServer` for tests |
| `commands` | `dpproxy serve` and `dpproxy analyst passwd` |
"""
