"""The demo's child processes: started in their own process groups, watched, all stopped.

Every component is a real ``unitscale`` (or vLLM) process whose output goes to a log
file under the report directory. One that exits unexpectedly stops the demo with its
name, exit status and the last lines of its log. ``stop_all`` sends SIGTERM to every
group, waits, then SIGKILLs what is left, so that nothing outlives the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from foundation.errors import UnitscaleError

MARKER = "UNITSCALE_DEMO_RUN"


class ComponentError(UnitscaleError):
    """A demo component exited or never became ready; the message says which and why."""


def unitscale_command(*args: str) -> list[str]:
    """``unitscale ARGS`` with this interpreter (works from a checkout or an install)."""
    return [sys.executable, "-m", "unitscale.cli", *args]


@dataclass(eq=False)
class Child:
    """One child process."""

    name: str
    process: asyncio.subprocess.Process
    log: Path
    retiring: bool = False
    """Being stopped on purpose: its exit is not a failure."""
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class Supervisor:
    """Starts, watches and stops the demo's processes."""

    def __init__(self, logs: Path, marker: str = "") -> None:
        self.logs = logs
        self.marker = marker
        """Set as ``UNITSCALE_DEMO_RUN`` in every child's environment: a way to find them."""
        self.children: list[Child] = []
        self.failure: asyncio.Queue[ComponentError] = asyncio.Queue()

    async def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Start ``argv`` in a new session, its output written to ``logs/NAME.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        # A fresh log per run, even in a reused directory: what stood there is removed,
        # never opened (a FIFO would hold the demo waiting for a reader).
        log.unlink(missing_ok=True)
        with log.open("xb") as out:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, MARKER: self.marker, **(env or {})},
            )
        child = Child(name, process, log)
        self.children.append(child)
        asyncio.get_running_loop().create_task(self._watch(child))
        return child

    async def _watch(self, child: Child) -> None:
        code = await child.process.wait()
        child.exited.set()
        if not child.retiring:
            await self.failure.put(
                ComponentError(
                    f"{child.name} (pid {child.pid}) exited with status {code}; the end of"
                    f" {child.log}:\n{child.tail()}"
                )
            )

    async def wait_http(self, child: Child, url: str, within: float) -> None:
        """Until ``url`` answers 200; fails if the child exits or ``within`` seconds pass."""
        deadline = asyncio.get_running_loop().time() + within
        async with aiohttp.ClientSession() as session:
            while True:
                if child.exited.is_set():
                    raise ComponentError(
                        f"{child.name} exited while starting; the end of {child.log}:\n"
                        + child.tail()
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            return
                if asyncio.get_running_loop().time() > deadline:
                    raise ComponentError(
                        f"{child.name} did not answer {url} within {within:g}s; the end of"
                        f" {child.log}:\n{child.tail()}"
                    )
                await asyncio.sleep(0.05)

    async def stop(self, child: Child, grace: float) -> None:
        """SIGTERM its group, wait up to ``grace``, then SIGKILL."""
        child.retiring = True
        _signal_group(child.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(child.exited.wait(), grace)
        except TimeoutError:
            _signal_group(child.pid, signal.SIGKILL)
            await child.exited.wait()
        _signal_group(child.pid, signal.SIGKILL)  # stragglers in its group (vLLM's engine)

    async def stop_all(self, grace: float = 10.0) -> None:
        """Stop every child still running, all at once."""
        running = [c for c in self.children if not c.exited.is_set()]
        await asyncio.gather(*(self.stop(c, grace) for c in running))

    async def leftovers(self, within: float = 5.0) -> list[int]:
        """Process groups of ours with a live (not zombie) process after ``within`` s.

        A SIGKILLed process takes a moment to go; one reparented to a PID 1 that does
        not reap (some containers) stays a zombie, which holds nothing and is not counted.
        """
        deadline = asyncio.get_running_loop().time() + within
        while True:
            alive = [c.pid for c in self.children if _group_alive(c.pid)]
            if not alive or asyncio.get_running_loop().time() > deadline:
                return alive
            await asyncio.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: any process of the group, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # comm may hold spaces and parentheses: the fields after the last ')' are fixed.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            return True
    return False


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
