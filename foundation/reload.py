"""Config hot reload: one frozen config object, swapped whole, from a file or a ConfigMap.

Semantics (Knative's ``configmap`` store): a bad config at startup is fatal (the caller
loads it with ``load_*`` and exits 2); a bad *update* logs an ERROR, is counted, and the
last good config stays. Readers take ``store.current`` once per unit of work; the object
is frozen, so a snapshot never changes under them.

Two sources feed a store:

- ``poll_file``: a ConfigMap mounted as a directory. The kubelet writes a new
  ``..2026_01_02_03_04_05.123`` directory and swaps the ``..data`` symlink atomically;
  ``config.yaml`` is a symlink through ``..data``. Polling ``os.readlink(..data)`` plus
  the file's stat every ``interval`` sees both that swap and a plain file edited in place.
- ``watch_configmap``: the ConfigMap itself through the API (``--config-configmap``),
  for a process that runs outside the pod or wants updates without the kubelet's delay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import aiohttp
from kubernetes_asyncio.client import ApiException

from foundation.daemon import in_daemon_thread
from foundation.errors import ConfigError
from foundation.files import MAX_CONFIG_BYTES, read_text
from foundation.kube import CONFIGMAPS, KubeAccess, Selection, get_object, watch_objects
from foundation.objects import RawObject

log = logging.getLogger(__name__)
C = TypeVar("C")

DEFAULT_KEY = "config.yaml"
"""The ConfigMap key holding the YAML, as in ``deploy/*/configmap.yaml``."""
MAX_CONFIG_TEXT = 1 << 20
"""Characters of config a reload parses: a ConfigMap holds at most 1 MiB in all."""

PARSE_DEADLINE = 60.0
"""Seconds a reload's parse may take off the loop: a megabyte ConfigMap took 9 s of CPU."""
RELOAD_GAP = 2.0
"""Seconds from one config applied to the next update read (``ConfigStore.settle``): a
config flapping every 25 ms made a scaler decide every ScaledObject each time (2,000 at
82% of a core), restarted its Prometheus rounds before one could finish (no signals at
all) and its signal watches (a WARNING each); the newest text is the one read."""
UNSTEADY_POLLS = 5
"""Polls a file may change at in a row before it is read as it is (``poll_file``)."""
QUIET_SECONDS = 0.2
"""How long ago a file's last write must be for a read of it to be taken (``poll_file``),
at most a quarter of the poll interval:
a writer writing a line every 70-90 ms, once a poll interval, had its first lines read
alike twice (each poll at the same point of its writing), or taken as a file swapped
whole (recreated each time), and applied: 0 signal sources (hostile pass 65)."""
RESTLESS_POLLS = 20
"""Reads in a row a file may be refused as just written before the rule is waived, its
reads taken by the others (two alike, or a whole swap): a sidecar rewriting it every
0.1 s never rested 0.2 s, and its change was never applied (hostile pass 66)."""
POLL_JITTER = 0.2
"""The share of the interval each poll is moved by, at random, so that no writer keeping
time with the polls finds every read at the same point of its writing."""
_BLANK_LINE = re.compile(
    r"%.*"  # a directive: %YAML 1.1, %TAG
    r"|[ \t]*(?:(?:---|\.\.\.)(?=[ \t]|$)[ \t]*)?"  # a document's start or end, or neither
    r"(?:(?:null|Null|NULL|~|!!null(?:[ \t]+(?:''|\"\"|null|Null|NULL|~))?)[ \t]*)?"  # a null
    r"(?:#.*)?"  # a comment
)
"""Each run of blanks follows a token it cannot be part of: with three ``\\s*`` in a row,
a line of 2,000 spaces before a letter took 40 s of backtracking (pass 63's own)."""
"""A line of a YAML text that holds no document: blank, a comment, a directive, a
marker, a null (``yaml.safe_dump(None, explicit_start=True)`` writes ``--- null``)."""


class ConfigStore(Generic[C]):
    """The current config and what happened to the updates.

    Attributes:
        current: the config in force (the last good one).
        reloads: updates applied.
        errors: updates refused (the old config stayed).
        last_error: why the latest refused update was refused; "" after a good one.
    """

    def __init__(
        self,
        initial: C,
        parse: Callable[[str, str], C],
        parse_deadline: float = PARSE_DEADLINE,
        reload_gap: float = RELOAD_GAP,
    ) -> None:
        self.current = initial
        self.parse_deadline = parse_deadline
        self.reload_gap = reload_gap
        self._parsed_at = -float("inf")
        self.reloads = 0
        self.errors = 0
        self.last_error = ""
        self._parse = parse
        self._listeners: list[Callable[[C], None]] = []

    def add_listener(self, listener: Callable[[C], None]) -> None:
        """Call ``listener(new_config)`` after every applied update."""
        self._listeners.append(listener)

    async def settle(self) -> None:
        """Wait until ``reload_gap`` has passed since the last update parsed.

        A reload loop waits here before it reads an update, then reads the newest. Any
        parse counts, applied or not: texts refused, or equal to the config in force,
        were parsed nonstop (1 MiB ones at 88-100% of a core, hostile pass 63).
        """
        left = self._parsed_at + self.reload_gap - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)

    def update(self, text: str, origin: str) -> bool:
        """Parse ``text``; swap it in when valid. Returns whether the config changed.

        Never raises for a bad update: a ``ConfigError``, or any other exception from
        parsing (a bug meeting an input nobody foresaw), is refused, logged as one ERROR
        line, counted, and the last good config stays. A listener that raises is logged
        the same way; the new config is in force and the other listeners still run.
        """
        return self._apply(self._parsed(text, origin), origin)

    async def update_off_loop(self, text: str, origin: str) -> bool:
        """``update``, with the parse in a worker thread: what a reload loop calls.

        Parsing a config is PyYAML's pure-Python loader and pydantic, and reads the
        side files it names (``profiles-file``): a megabyte ConfigMap took 9 s of CPU,
        which on the event loop is 9 s without a gRPC answer or a health check. Text
        over ``MAX_CONFIG_TEXT`` is refused before any parse; the swap, the count and
        the listeners stay on the loop, as with ``update``.
        """
        if len(text) > MAX_CONFIG_TEXT:
            return self._apply(
                f"{origin}: over {MAX_CONFIG_TEXT:,} characters, the most read", origin
            )
        return self._apply(await self._parsed_by_deadline(text, origin), origin)

    async def _parsed_by_deadline(self, text: str, origin: str) -> tuple[C] | str:
        """``_parsed`` in a daemon thread, refused past ``parse_deadline`` seconds.

        A parse that never ends (a side file that blocks its ``open``) held the reload
        loop for good: every later change was ignored while health said SERVING, and
        ``asyncio.to_thread``'s worker held up the process's exit. Past the deadline the
        thread is left to itself (a daemon: it holds up nothing) and the next change is
        read as usual.
        """
        parsing = in_daemon_thread(lambda: self._parsed(text, origin), f"config-parse {origin}")
        try:
            return await asyncio.wait_for(parsing, self.parse_deadline)
        except TimeoutError:
            return f"{origin}: not parsed within {self.parse_deadline:g}s (a file it names blocks?)"

    def _parsed(self, text: str, origin: str) -> tuple[C] | str:
        """``(config,)``, or why the text is refused. No side effect: runs in a thread."""
        try:
            return (self._parse(text, origin),)
        except ConfigError as err:
            return str(err)
        except Exception as err:  # defence in depth: a reload must never stop the watch
            log.debug("config parse of %s raised", origin, exc_info=True)
            return f"{origin}: cannot parse ({_describe_exception(err)})"

    def _apply(self, parsed: tuple[C] | str, origin: str) -> bool:
        """Swap a parsed config in, if it differs, and tell the listeners; or refuse."""
        self._parsed_at = time.monotonic()
        if isinstance(parsed, str):
            self.reject(parsed)
            return False
        (new,) = parsed
        self.last_error = ""
        if new == self.current:
            return False
        self.current = new
        self.reloads += 1
        log.info("config reloaded from %s", origin)
        for listener in self._listeners:
            try:
                listener(new)
            except Exception as err:
                log.debug("config listener raised", exc_info=True)
                log.error(
                    "config from %s is in force, but applying it failed: %s",
                    origin,
                    _describe_exception(err),
                )
        return True

    def reject(self, reason: str) -> None:
        """Count and log an update that cannot be used; the current config stays."""
        self.errors += 1
        self.last_error = _clip(reason)
        log.error("config update refused, keeping the last good config: %s", self.last_error)


_REASON_LIMIT = 2000


def _clip(text: str) -> str:
    """One log line of bounded length, whatever a message held."""
    line = " ".join(text.splitlines())
    if len(line) <= _REASON_LIMIT:
        return line
    return f"{line[:_REASON_LIMIT]}… ({len(line)} characters)"


def _describe_exception(err: BaseException) -> str:
    return _clip(f"{type(err).__name__}: {err}")


def file_fingerprint(path: Path) -> tuple[object, ...]:
    """What changes when a mounted file's content may have changed.

    The ``..data`` target changes on every kubelet update; inode, size and mtime
    catch a file rewritten in place (editors, ``kubectl cp``, tests), and ctime one
    whose mtime was put back (``cp -p``, ``touch -r``, ``tar x``) at the same size.
    """
    data_link = path.parent / "..data"
    try:
        target: str | None = os.readlink(data_link)
    except OSError:
        target = None
    try:
        st = path.stat()
    except OSError:
        return (target, None)
    return (target, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


async def poll_file(
    store: ConfigStore[C],
    path: Path,
    interval: float = 1.0,
    seen: tuple[object, ...] | None = None,
) -> None:
    """Reload ``path`` into ``store`` whenever its fingerprint changes, forever.

    ``seen`` is the fingerprint of the text ``store`` started from (``ConfigSource.read``
    takes it), so that a change between that read and this watch is not missed; without
    it the file as it is now is the baseline. Nothing an update holds ends the loop.

    A change is read once the fingerprint held still for one poll: a file rewritten in
    place is truncated, then written, and a poll between the two read the empty file
    (valid YAML: every default) and applied it (issue 27, hostile pass 11). A file that
    changes at ``UNSTEADY_POLLS`` polls in a row (a sidecar rewriting it) is read as it
    is, and taken once two reads in a row find the same text: waiting for it to hold
    still, its changes were never read (hostile pass 62); taken at one read, a writer
    writing a line at a time had halves of the config applied (pass 63). Either read is
    taken only if the fingerprint held across it and the file was last written
    ``QUIET_SECONDS`` before (a quarter of the interval at most; waived after
    ``RESTLESS_POLLS`` reads in a row refused so); polls are moved by
    ``POLL_JITTER`` at random. A text holding no YAML document (empty, comments,
    ``---``, ``null``) after one with a document is refused,
    the last good config kept: a writer that stopped halfway, never a config anyone
    meant (a kubelet swaps a ConfigMap whole; ``{}`` is the defaults). A read that
    fails is tried again at the next poll, refused (logged) once.
    """
    if seen is None:
        seen = file_fingerprint(path)
    had_text = _holds_text(seen)
    quiet = min(QUIET_SECONDS, interval / 4)  # a sidecar writing at every poll rests that long
    restless = 0  # reads in a row refused as written within ``quiet``
    sizes: deque[object] = deque(maxlen=UNSTEADY_POLLS)  # the file's size at the last polls
    changed: tuple[object, ...] | None = None
    unsteady = 0
    failed: tuple[object, ...] | None = None  # the fingerprint whose read failed last
    warned = False
    unsteady_text: str | None = None  # the last text read as it was (``_content``)
    unsteady_at: tuple[object, ...] | None = None  # and its fingerprint
    while True:
        await asyncio.sleep(interval * random.uniform(1 - POLL_JITTER, 1 + POLL_JITTER))
        now = file_fingerprint(path)
        sizes.append(now[2] if len(now) > 2 else None)
        if now == seen:
            changed, unsteady = None, 0
            continue
        if now != changed:
            changed, unsteady = now, unsteady + 1
            if unsteady < UNSTEADY_POLLS:
                continue  # read it once it held still for a poll
            if not warned:  # once: a sidecar rewriting it does so for good
                log.warning("%s changed at each of %d polls: read as it is", path, unsteady)
                warned = True
        await store.settle()
        before = file_fingerprint(path)
        try:
            text = await asyncio.to_thread(read_text, path, MAX_CONFIG_BYTES, "config file")
        except ConfigError as err:
            if failed != before:  # a fingerprint seen: tried at every poll, refused once
                store.reject(str(err))
            failed = before
            continue
        if file_fingerprint(path) != before:
            continue  # written while read: read again
        restive = _written_within(before, quiet)
        if restless < RESTLESS_POLLS and restive:
            restless += 1
            continue  # being written: read again once it rests
        size = before[2] if len(before) > 2 else None
        if restive and (len(sizes) < UNSTEADY_POLLS or any(z != size for z in sizes)):
            # Past the waiver, a file whose size moved within the last polls is being
            # written: a writer recreating it a line every 90 ms was read alike twice
            # at a half (0 targets applied); a sidecar writing it whole keeps its size.
            continue
        # A file swapped whole since the last read (another inode, or ..data) is whole:
        # a writer renaming a stamped file in place was never read twice alike (pass 64).
        # Not one just written past the waiver: a writer recreating the file a line at
        # a time makes a new inode each time, its halves applied (hostile pass 67).
        swapped = not restive and unsteady_at is not None and before[:2] != unsteady_at[:2]
        content = _content(text)
        if (unsteady >= UNSTEADY_POLLS or restive) and content != unsteady_text and not swapped:
            unsteady_text, unsteady_at = content, before  # taken when the next read agrees
            continue
        seen, changed, unsteady, failed, unsteady_text = before, None, 0, None, None
        restless = 0
        unsteady_at = None
        blank = holds_no_document(text)  # once: up to a MiB, on the loop
        if had_text and blank:
            store.reject(f"{path}: the file holds no YAML document (write {{}} for the defaults)")
            continue
        had_text = not blank
        await store.update_off_loop(text, str(path))


def _content(text: str) -> str:
    """A config's text with each comment cut to its ``#``: two reads alike are alike in this.

    A sidecar stamping the file as it rewrites it (``# written at ...``) was never read
    twice alike, its changes never applied (hostile pass 68). A comment's ``#`` stays:
    dropped whole, a file grown by comment lines alone (a writer halfway) read alike, and
    its half was applied (pass 69). A ``#`` inside a quoted scalar is no comment; a quote
    inside a comment or a plain scalar (``don't``) opens nothing.

    >>> _content("a: 1  # stamp 17")
    'a: 1 #'
    >>> _content("b: 'x # y' # by Bob's sidecar")
    "b: 'x # y' #"
    """
    if "#" not in text:
        return text
    lines = []
    for line in text.splitlines():
        at = _comment_at(line) if "#" in line else None
        if at is None:
            lines.append(line)
        else:
            kept = line[:at].rstrip()
            lines.append(f"{kept} #" if kept else f"{line[:at]}#")
    return "\n".join(lines)


def _comment_at(line: str) -> int | None:
    """Where a YAML line's comment begins, if it holds one.

    A ``#`` after a blank (or first), outside quotes; a quote opens a scalar only where
    one begins (first, or after a blank or one of ``[{,:``).
    """
    quote = ""
    before = " "
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if quote == '"' and c == "\\":
                i += 1  # the escaped character
            elif c == quote and quote == "'" and line[i + 1 : i + 2] == "'":
                i += 1  # '' inside single quotes
            elif c == quote:
                quote = ""
        elif c in "'\"" and before in " \t[{,:":
            quote = c
        elif c == "#" and before in " \t":
            return i
        before = c
        i += 1
    return None


def holds_no_document(text: str) -> bool:
    """Whether a YAML text is empty: blank lines, comments, directives, markers, a null."""
    return all(_BLANK_LINE.fullmatch(line) for line in text.lstrip("\ufeff").splitlines())


def _written_within(fingerprint: tuple[object, ...], seconds: float) -> bool:
    """Whether the file so fingerprinted was written less than ``seconds`` ago.

    A time ahead of this clock's (another host's, skewed) says nothing: not within.
    """
    written = fingerprint[3] if len(fingerprint) > 3 else None
    if not isinstance(written, int):
        return False
    return 0 <= time.time_ns() - written < seconds * 1e9


def _holds_text(fingerprint: tuple[object, ...]) -> bool:
    """Whether the file so fingerprinted had content (``file_fingerprint``'s size)."""
    size = fingerprint[2] if len(fingerprint) > 2 else None
    return isinstance(size, int) and size > 0


def parse_configmap_ref(ref: str) -> tuple[str, str, str]:
    """``NAMESPACE/NAME[:KEY]`` -> (namespace, name, key); the key defaults to config.yaml.

    Raises:
        ConfigError: not in that form.
    """
    where, _, key = ref.partition(":")
    namespace, _, name = where.partition("/")
    if not namespace or not name or "/" in name:
        raise ConfigError(f"--config-configmap {ref!r}: expected NAMESPACE/NAME[:KEY]")
    return namespace, name, key or DEFAULT_KEY


def configmap_text(objects: dict[str, RawObject], name: str, key: str) -> str:
    """The YAML under ``key`` of ConfigMap ``name`` in a watched set.

    Raises:
        ConfigError: the ConfigMap or the key is missing, or ``data`` is not a mapping
            of keys to text (a list or a string raised TypeError in the watch's
            callback; a nested mapping was turned into text by ``str`` and parsed).
    """
    configmap = objects.get(name)
    if configmap is None:
        raise ConfigError(f"ConfigMap {name!r} not found")
    data = configmap.get("data") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"ConfigMap {name!r} has data that is no mapping of keys")
    if key not in data:
        raise ConfigError(f"ConfigMap {name!r} has no key {key!r} (keys: {sorted(data)})")
    text = data[key]
    if not isinstance(text, str):
        raise ConfigError(f"ConfigMap {name!r} key {key!r} is no text")
    return text


async def read_configmap(access: KubeAccess, namespace: str, name: str, key: str) -> str:
    """The ConfigMap's YAML once, for startup (where any problem is fatal).

    Read as the watch reads (``foundation.kube.get_object``: at most ``MAX_ANSWER_BYTES``,
    the JSON checked here): the generated client read an endless answer until
    MemoryError, and a hang-up or a ``data`` list came out as 60-line tracebacks.

    Raises:
        ConfigError: unreachable API, a bad answer, missing ConfigMap or key.
    """
    where = f"--config-configmap {namespace}/{name}"
    try:
        async with await access.client() as api:
            configmap = await get_object(api, CONFIGMAPS, namespace, name)
    except ApiException as err:
        raise ConfigError(f"{where}: {err.status} {err.reason}") from err
    except (OSError, aiohttp.ClientError, ValueError) as err:  # TimeoutError is an OSError
        raise ConfigError(f"{where}: {_describe_exception(err)}") from err
    try:
        return configmap_text({name: configmap}, name, key)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err


REPARSE_REFUSED_SECONDS = 60.0
"""A ConfigMap text refused is parsed again, when an event hands it over again, at most
this often: a side file it names may have been fixed since."""


async def watch_configmap(
    store: ConfigStore[C], access: KubeAccess, namespace: str, name: str, key: str
) -> None:
    """Feed every change of the ConfigMap's ``key`` into ``store``, forever.

    The watch's callback must not block, so it only keeps the newest text; a task of
    its own parses it off the loop (``update_off_loop``). The same good text again
    (every resync hands the ConfigMap over) is not parsed again, the same key missing or
    blank not refused again (an ERROR at each resync of a ConfigMap blank from the start).
    """
    origin = f"configmap {namespace}/{name}:{key}"
    newest: list[str | ConfigError] = []
    arrived = asyncio.Event()

    def changed(objects: dict[str, RawObject]) -> None:
        try:
            newest[:] = [configmap_text(objects, name, key)]
        except ConfigError as err:
            newest[:] = [err]
        arrived.set()

    async def apply() -> None:
        applied: str | None = None
        refused: tuple[str, float] | None = None  # the text refused last, and when
        missing: str | None = None  # why the last update held no config, refused once
        clock = asyncio.get_running_loop().time
        while True:
            await arrived.wait()
            await store.settle()  # then the newest text
            arrived.clear()
            (update,) = newest
            if isinstance(update, ConfigError) or holds_no_document(update):
                why = (
                    f"{origin}: {update}"
                    if isinstance(update, ConfigError)
                    # As for a file: the defaults are written {} (an emptied key took
                    # every default, every signal source dropped, hostile pass 63).
                    else f"{origin}: holds no YAML document (write {{}} for the defaults)"
                )
                # Every resync hands it over again: refused (an ERROR) once, until it changes.
                if why != missing:
                    store.reject(why)
                applied, refused, missing = None, None, why
                continue
            missing = None
            if update != applied:
                if refused is not None and refused[0] == update:
                    if clock() - refused[1] < REPARSE_REFUSED_SECONDS:
                        continue  # the same refused text: refused already, not parsed
                await store.update_off_loop(update, origin)
                # A refused text is parsed again once a while (a side file it names
                # may have been fixed since), not at every event: each event with a
                # refused 1 MiB text cost 4.4 s of a core (hostile pass 15).
                if store.last_error:
                    applied, refused = None, (update, clock())
                else:
                    applied, refused = update, None

    selection = Selection("configmaps", namespace, field_selector=f"metadata.name={name}")
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(apply())
        tasks.create_task(watch_objects(access, selection, changed))


class ConfigSource:
    """Where a process's config comes from: nothing, a mounted file, or a ConfigMap."""

    def __init__(
        self,
        file: Path | None = None,
        configmap: str | None = None,
        kube: KubeAccess | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        """Validate the choice.

        Raises:
            ConfigError: both a file and a ConfigMap, or a malformed ConfigMap reference.
        """
        if file is not None and configmap is not None:
            raise ConfigError("--config and --config-configmap exclude each other")
        self.file = file
        # `--config-configmap ''` names no ConfigMap: refused, not taken as none (a server
        # meant to follow a ConfigMap started on its defaults, hostile pass 7).
        self.configmap = parse_configmap_ref(configmap) if configmap is not None else None
        self.kube = kube or KubeAccess()
        self.poll_interval = poll_interval
        self._read_fingerprint: tuple[object, ...] | None = None

    @property
    def origin(self) -> str:
        """The source as error messages name it."""
        if self.configmap is not None:
            namespace, name, key = self.configmap
            return f"configmap {namespace}/{name}:{key}"
        return str(self.file) if self.file is not None else "flags"

    async def read(self) -> str:
        """The config text now ("" without a source), for startup.

        Raises:
            ConfigError: unreadable file, unreachable API, missing ConfigMap or key.
        """
        if self.configmap is not None:
            return await read_configmap(self.kube, *self.configmap)
        if self.file is None:
            return ""
        # Taken before reading: a change racing the read is seen again, never missed.
        self._read_fingerprint = file_fingerprint(self.file)
        return await asyncio.to_thread(read_text, self.file, MAX_CONFIG_BYTES, "config file")

    async def follow(self, store: ConfigStore[C]) -> None:
        """Feed updates into ``store`` forever; without a source, wait until cancelled.

        Never returns: a server runs this as a loop that must last, and one that ended
        would read as a dead reload loop (a scaler without ``--config`` reported gRPC
        ``NOT_SERVING`` from its first second).
        """
        if self.configmap is not None:
            await watch_configmap(store, self.kube, *self.configmap)
        elif self.file is not None:
            await poll_file(store, self.file, self.poll_interval, self._read_fingerprint)
        else:
            await asyncio.Event().wait()  # nothing to follow; cancelled by stop()
