"""Work run in a daemon thread and awaited: nothing it does holds up the process's exit.

``asyncio.to_thread`` and a ``ThreadPoolExecutor`` run work in threads the interpreter
joins at exit: a parse that blocked on a side file, or an admission resync that hangs,
held a stopping process until the kubelet killed it at the end of its grace period. A
daemon thread is left to itself once nothing awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_daemon_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` in a daemon thread named ``name``; its result, or what it raised.

    Cancelling the wait leaves the thread to finish on its own, its result dropped.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return  # no one waits any more
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        error: BaseException | None = None
        try:
            result = work()
        except Exception as err:  # handed to the awaiting task, as an executor would
            result, error = None, err
        except BaseException as err:
            # SystemExit or KeyboardInterrupt from the work is no word to stop the
            # process: handed to the task as is, asyncio re-raises it out of the loop
            # (a config parse calling sys.exit ended the server, hostile pass 44).
            result = None
            error = RuntimeError(f"the work raised {type(err).__name__}: {err}")
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
