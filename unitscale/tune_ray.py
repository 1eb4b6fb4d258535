"""``unitscale tune --ray``: the trials' replays as Ray tasks, for nights past one machine.

Ray (the ``ray`` extra) schedules the replays over a cluster's CPUs, one CPU a task, and
hands the results back in order, so the search (asked and told batch by batch) proposes
what ``--workers`` would. The problem (every trace) goes to the object store once.

Where the command meets Ray, and why each guard:

- ``local`` starts a Ray on this machine for the command's length (``address="local"``:
  a ``RAY_ADDRESS`` in the environment made it join that cluster instead);
- any other address joins a running cluster (``auto``: the one this machine is part of,
  or ``RAY_ADDRESS``; ``HOST:PORT``; ``ray://HOST:PORT``), whose workers must have
  unitscale installed at the command's version (the same image). The address must answer
  as a gRPC server (Ray's GCS and its client server are) within ``CONNECT_SECONDS``: Ray
  itself retried a port that took a connection and said nothing for minutes, a few log
  lines a round (hostile pass 45);
- a Ctrl-C or SIGTERM while the local Ray starts is held until it has started, then the
  Ray is shut down and the signal acted on: one landing inside ``ray.init`` left its
  agents running for good, about 200 MB each time. Ray's own SIGTERM handlers are not
  installed meanwhile: they replaced the hold. Later a SIGTERM is an exit (143), the
  Ray shut down on the way, where Ray's own handler printed a crash report;
- Ray's own INFO and WARNING lines and warnings are kept off the command's stderr.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType
from typing import Any

from foundation.errors import ConfigError, quote
from unitscale.tune import Mapper, Problem, _cpus, _install

CONNECT_SECONDS = 10.0
"""How long a cluster's address has to answer as a gRPC server before the command gives up."""
FORMS = "local, auto, HOST:PORT or ray://HOST:PORT"


@contextmanager
def ray_pool(problem: Problem, address: str) -> Iterator[Mapper]:
    """A ``Mapper`` whose jobs are Ray tasks on the cluster ``address`` names.

    Raises:
        ConfigError: Ray is not installed, the address is malformed, does not answer, or
            Ray refuses it; one line naming ``--ray``.
    """
    ray = _import_ray()
    started = not ray.is_initialized()
    with _terminate_as_exit():
        if started:
            _start(ray, address)
        try:
            shared = ray.put(problem)
            task = ray.remote(num_cpus=1)(_ray_job)

            def there(job: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
                return list(ray.get([task.remote(shared, job, a) for a in args]))

            yield there
        finally:
            if started:
                ray.shutdown()


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM ends the command as an exit (143), so that the Ray it started is shut down.

    Ray's own handler in the driver printed 20 lines of a crash report and left the
    agents of a Ray still starting behind. Main thread only; the handler before is put
    back.
    """

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    try:
        before = signal.signal(signal.SIGTERM, leave)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as err:
        raise ConfigError("--ray needs Ray: pip install 'unitscale[ray]'") from err
    return ray


def _start(ray: ModuleType, address: str) -> None:
    """``ray.init`` for ``address``, checked first, signals held while it runs."""
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
    }
    if address == "local":
        options.update(address="local", num_cpus=_cpus())
    else:
        target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
        if target not in ("", "auto", "local"):
            _answers(address, target)
        options["address"] = address
    held: list[int] = []
    refused: Exception | None = None
    with _signals_held(held), _ray_sigterm_handlers_off(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError) as err:
            refused = err
    if held:  # asked to stop while Ray started (or failed to): stop it, then as asked
        ray.shutdown()
        if held[0] == signal.SIGINT:
            raise KeyboardInterrupt
        signal.raise_signal(held[0])
    if refused is not None:
        raise ConfigError(f"--ray {quote(address)}: {str(refused)[:300]}") from refused


@contextmanager
def _signals_held(held: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM recorded in ``held`` instead of acted on (main thread only).

    The handlers before are put back, also over any Ray installed meanwhile.
    """

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    kinds = (signal.SIGINT, signal.SIGTERM)
    try:
        before = {kind: signal.signal(kind, hold) for kind in kinds}
    except ValueError:  # not the main thread: nothing to hold
        yield
        return
    try:
        yield
    finally:
        for kind, handler in before.items():
            signal.signal(kind, handler)


@contextmanager
def _ray_sigterm_handlers_off() -> Iterator[None]:
    """Ray's own SIGTERM handlers not installed while ``ray.init`` runs.

    ``ray.init`` installs one first thing (``sys.exit``), and the node it starts another
    (kill what it started, then exit): either replaced ``_signals_held``'s, and a SIGTERM
    then ended the command inside ``ray.init`` with the raylet's dashboard and
    runtime-env agents left running (hostile pass 45). Both go through
    ``ray._private.utils.set_sigterm_handler``; a Ray without it installs nothing here.
    """
    utils = sys.modules.get("ray._private.utils")
    install = getattr(utils, "set_sigterm_handler", None)
    if utils is None or install is None:
        yield
        return
    setattr(utils, "set_sigterm_handler", _not_installed)  # noqa: B010 (a module of Ray's)
    try:
        yield
    finally:
        setattr(utils, "set_sigterm_handler", install)  # noqa: B010


def _not_installed(handler: Callable[[int, FrameType | None], Any]) -> None:
    """Stands in for Ray's ``set_sigterm_handler`` while ``ray.init`` runs."""


def _answers(address: str, target: str) -> None:
    """Refuse ``target`` unless it answers as a gRPC server within ``CONNECT_SECONDS``.

    A TCP connection first (a refused port or an unknown host is said at once); under
    ``RAY_USE_TLS`` that is all, a plaintext handshake would fail a good cluster.
    """
    import grpc

    where = target.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--ray {quote(address)}: expected {FORMS}")
    _connects(address, host.strip("[]"), int(port))  # refused or unknown: said at once
    if os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return
    channel = grpc.insecure_channel(where)
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_SECONDS)
    except grpc.FutureTimeoutError:
        raise ConfigError(
            f"--ray {quote(address)}: {quote(where)} did not answer as a Ray cluster (gRPC)"
            f" within {CONNECT_SECONDS:g}s"
        ) from None
    finally:
        channel.close()


def _connects(address: str, host: str, port: int) -> None:
    import socket

    try:
        with socket.create_connection((host, port), CONNECT_SECONDS):
            pass
    except (OSError, UnicodeError) as err:
        raise ConfigError(f"--ray {quote(address)}: cannot connect: {err}") from err


def _ray_job(problem: Problem, job: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """One job in a Ray worker, the task's problem installed (a worker may serve several)."""
    _install(problem)
    return job(*args)
