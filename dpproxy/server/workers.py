"""`dpproxy serve --workers N`: N server processes on one port, each with its own GIL.

The parent reserves the port, starts N worker processes (spawned, never forked: a
fork would copy DuckDB's and SQLite's threads and locks mid-flight) and then only
supervises: it restarts a worker that dies and, on SIGTERM or SIGINT, passes SIGTERM
to every worker and waits while each shuts down gracefully (`Server.shutdown`).

Each worker builds its own `Engine` from the policy and listens on the port with
SO_REUSEPORT, so the kernel spreads connections among them. What they share:

* the ledger: the same SQLite file (or PostgreSQL schema), safe across processes, so
  budgets are charged exactly once whatever worker runs a query, and the answer cache
  (kept in the ledger) is common to all;
* a count of open connections per worker, so `server.max_connections` holds for the
  whole server;
* one cancel queue per worker: BackendKeyData process ids carry the owning worker's
  index, and a CancelRequest reaching another worker is put on the owner's queue.

Rewrite and parse caches stay per process. A worker whose parent dies (even by
SIGKILL) gets SIGTERM from the kernel and shuts down gracefully: no orphan goes on
serving, and charging, on a port nobody supervises.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from .. import errors
from ..policy import Policy, ServerSettings, load_policy
from .server import SHUTDOWN_GRACE_S, pid_owner

log = logging.getLogger("dpproxy.server")
_ctx = multiprocessing.get_context("spawn")
READY_TIMEOUT_S = 120.0  # bound on a worker's start (imports, DuckDB, ledger)


def auto_workers() -> int:
    """`--workers auto`: one worker per core where SO_REUSEPORT spreads connections
    (Linux), else one."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        return 1
    return max(1, os.cpu_count() or 1)


def parse_workers(value: str) -> int:
    """The --workers argument: a positive number or "auto"."""
    if value.strip().lower() == "auto":
        return auto_workers()
    try:
        workers = int(value)
    except ValueError:
        workers = 0
    if not 1 <= workers <= 127:  # the index must fit a process id's top byte
        raise errors.InvalidParameterValue(f"--workers must be 1 to 127 or auto, got {value!r}")
    return workers


@dataclass
class WorkerShared:
    """The state one worker shares with the others (picklable into spawned processes)."""

    index: int
    counts: Any  # multiprocessing Array of open connections per worker
    queues: list[Any]  # one cancel queue per worker

    def take_slot(self, limit: int) -> bool:
        """Count a new connection unless the whole server is at `limit`."""
        with self.counts.get_lock():
            if sum(self.counts) >= limit:
                return False
            self.counts[self.index] += 1
            return True

    def free_slot(self) -> None:
        with self.counts.get_lock():
            self.counts[self.index] = max(0, self.counts[self.index] - 1)

    def forward_cancel(self, owner: int, process_id: int, secret_key: int) -> None:
        if 0 <= owner < len(self.queues):
            self.queues[owner].put((process_id, secret_key))
        else:
            log.info("cancel request for an unknown backend %d ignored", process_id)


def _reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind (without listening) so port 0 picks one port that every worker then shares;
    a bound, non-listening socket receives no connections."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise errors.OperationalError(f"cannot listen on {host}:{port}: {exc}") from None
    return sock, sock.getsockname()[1]


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent exits (Linux); exit if it already has."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.warning("cannot tie the worker's life to its parent's")
    if os.getppid() != parent:  # the parent died before the request took effect
        sys.exit(1)


def _worker_main(policy: Policy, settings: ServerSettings, shared: WorkerShared,
                 ready: Any, log_level: int, parent: int) -> None:
    """A worker process: its own engine and asyncio server until SIGTERM or SIGINT, on the
    policy the server started with (a worker started again later must not serve an edit
    its siblings wait to restart for), with the file's analysts as they are now."""
    import asyncio

    _die_with_parent(parent)

    from ..session import Engine
    from .server import Server

    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s[{shared.index}]: "
                               "%(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM

    async def main(engine: Engine) -> None:
        server = Server(engine, settings, worker=shared)
        await server.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)

        def cancels() -> None:  # cancel requests other workers received for our connections
            while (item := shared.queues[shared.index].get()) is not None:
                loop.call_soon_threadsafe(server.cancel, *item)

        listener = threading.Thread(target=cancels, name="dpproxy-cancels", daemon=True)
        listener.start()
        ready.put(shared.index)
        await stop.wait()
        log.info("shutting down")
        await server.shutdown()
        shared.queues[shared.index].put(None)

    with Engine(policy) as engine:
        engine.refresh_analysts(force=True)
        asyncio.run(main(engine))


def serve_workers(policy_path: Path, settings: ServerSettings, workers: int,
                  announce: Any = None) -> int:
    """Run `workers` server processes on one port until SIGTERM or SIGINT; returns the exit
    status (0 when every worker stopped cleanly). `announce(port)` once all listen."""
    policy = load_policy(policy_path)  # once: every worker, restarted ones too, serves it
    reserved, port = _reserve_port(settings.host, settings.port)
    settings = replace(settings, port=port)
    counts = _ctx.Array("i", workers)
    queues = [_ctx.Queue() for _ in range(workers)]
    ready = _ctx.Queue()
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    level = logging.getLogger().getEffectiveLevel()

    def start(index: int) -> SpawnProcess:
        with counts.get_lock():
            counts[index] = 0  # a dead worker's connections died with it
        process = _ctx.Process(target=_worker_main, name=f"dpproxy-worker-{index}",
                               args=(policy, settings,
                                     WorkerShared(index, counts, queues), ready, level,
                                     os.getpid()))
        process.start()
        return process

    processes = [start(i) for i in range(workers)]
    try:
        started, deadline = 0, time.monotonic() + READY_TIMEOUT_S
        while started < workers and not stop.is_set():
            try:
                ready.get(timeout=0.5)
                started += 1
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in processes):
                    raise errors.OperationalError("a server worker did not start",
                                                  hint="see its log above") from None
        if announce is not None and not stop.is_set():
            announce(port)
        while not stop.wait(0.5):
            for index, process in enumerate(processes):
                if not process.is_alive() and not stop.is_set():
                    log.error("worker %d exited with status %s; starting another", index,
                              process.exitcode)
                    processes[index] = start(index)
        log.info("shutting down %d workers", workers)
    finally:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.join(SHUTDOWN_GRACE_S + 15)
            if process.is_alive():
                process.kill()
                process.join(10)
        reserved.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if all(p.exitcode == 0 for p in processes) else 1


__all__ = ["WorkerShared", "auto_workers", "parse_workers", "pid_owner", "serve_workers"]
