"""dpproxy: a differential-privacy gateway for SQL.

`dpproxy.connect(policy, analyst=...)` opens a DB-API 2.0 connection; see
`dpproxy.dbapi`. The data flow is one module per step: parse, analyze, plan,
rewrite, accountant (charge), backends (execute), release, session (respond).
"""

from . import dbapi
from .dbapi import *  # noqa: F403 - the DB-API module globals are the package's

__version__ = "0.1.0"

__all__ = [*dbapi.__all__, "__version__"]
