"""Talking to the Kubernetes API: client access and a list-then-watch loop.

``watch_objects`` is a small informer: it lists the selected objects, then watches from
the list's ``resourceVersion``; every change hands the whole current set (key -> raw
JSON object) to a callback. The key is the object's name, or ``namespace/name`` when
the selection spans every namespace. The watch ends after ``resync`` seconds
(server-side timeout) and the loop lists again, so a missed event is repaired within one
resync. A broken connection (an API server restart), or a watch that ends or expires
(``410 GoneError``) before it held ``min(reconnect_max, resync / 2)``, relists after a
capped, doubling backoff that starts again only after a watch that held; meanwhile the
last known set stays in use.

Any resource works (``Resource``: the core group, built-in groups, custom resources). One
the server does not serve (a CRD not installed) answers 404: ``on_error`` hears it and
the loop keeps trying at the capped backoff, so a CRD installed later is picked up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from foundation.errors import ConfigError
from foundation.files import MAX_CONFIG_BYTES, MAX_PEM_BYTES, MiB, read_bytes
from foundation.objects import RawObject

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """How to reach the API server: a kubeconfig file, or the pod's service account.

    ``kubeconfig=None`` means in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else
    ``$KUBECONFIG`` or ``~/.kube/config`` (kubectl's order).
    """

    kubeconfig: Path | None = None

    async def client(self) -> client.ApiClient:
        """A new API client; the caller closes it.

        Raises:
            ConfigError: no usable kubeconfig or service account.
        """
        configuration = client.Configuration()
        try:
            if self.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                files = self._kubeconfig_file()
                self._check_files(files)
                await config.load_kube_config(
                    config_file=files,
                    client_configuration=configuration,
                    persist_config=False,
                )
            # Built here, not after: its TLS context reads the CA (ssl.SSLError on
            # certificate-authority-data that is no PEM), and it asserts on a server
            # that is no string; either ended a watch loop for good.
            return client.ApiClient(configuration)
        except ConfigError:
            raise
        except (
            config.ConfigException,
            OSError,
            yaml.YAMLError,
            ValueError,
            TypeError,
            AttributeError,
            LookupError,
            AssertionError,
        ) as err:
            # The client's parse of a file of the wrong shape: yaml's errors (not UTF-8,
            # a NUL), a UnicodeDecodeError, a list where a mapping goes; each came out as
            # a traceback of 60 lines
            why = _clip(str(err)) or type(err).__name__
            raise ConfigError(f"--kubeconfig {self._where}: {why}") from err
        except RecursionError as err:
            raise ConfigError(f"--kubeconfig {self._where}: YAML nested too deeply") from err

    @property
    def _where(self) -> str:
        return str(self.kubeconfig or "in-cluster/KUBECONFIG/~/.kube/config")

    def _kubeconfig_file(self) -> str:
        path = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        return os.path.expanduser(path)

    @staticmethod
    def _check_files(files: str) -> None:
        """Each kubeconfig the client would read, and each file one names.

        A kubeconfig: a regular file, at most 1 MiB; a user's ``tokenFile``: at most
        64 KiB; a cluster's ``certificate-authority``, a user's ``client-certificate`` and
        ``client-key``: at most ``MAX_PEM_BYTES``. The client opens these by path:
        ``/dev/zero`` was read until memory ran out, a FIFO waited on for good. None of
        the kubeconfigs there, or the only one empty, is said here (the client logged a
        warning and blamed a missing current-context, or a ``NoneType``); one missing
        from a list, or a kubeconfig of the wrong shape, stays the client's to report
        (KUBECONFIG lists may name files not there). A list names at most
        ``MAX_KUBECONFIG_FILES``.
        """
        listed = [os.path.expanduser(n) for n in files.split(os.pathsep) if n]  # as the client
        if len(listed) > MAX_KUBECONFIG_FILES:  # each up to 1 MiB, parsed and merged (~1 s)
            raise ConfigError(
                f"--kubeconfig {_clip(files)}: lists {len(listed):,} files; at most"
                f" {MAX_KUBECONFIG_FILES} are read"
            )
        there = [name for name in listed if os.path.lexists(name)]
        if not there:  # the client logged a warning, then blamed a missing current-context
            raise ConfigError(f"--kubeconfig {_clip(files)}: no such file")
        for name in there:
            data = read_bytes(Path(name), MAX_CONFIG_BYTES, "kubeconfig")
            parsed = _parsed(data, name)
            if len(there) == 1 and not data.strip():
                raise ConfigError(f"--kubeconfig {name}: empty")
            for path, what, limit in _named_files(parsed, Path(name).parent):
                if os.path.lexists(path):
                    read_bytes(path, limit, f"kubeconfig {what}")


MAX_TOKEN_BYTES = 64 * 1024
"""A bearer token file: a service account's JWT is about 1 KiB."""
MAX_KUBECONFIG_FILES = 16
"""Files one ``--kubeconfig``/``$KUBECONFIG`` list may name: each is parsed twice and merged
(~1 s for 1 MiB), and a 128 KiB flag listed thousands (issue 27, hostile pass 5, M1)."""
MAX_ENTRIES = 256
"""Clusters, contexts or users one kubeconfig may list: the client merges them pairwise
(10,000 users took 28 s, a 1 MiB file of 60,000 never ended)."""

_NAMED_FILES = (
    ("clusters", "cluster", "certificate-authority", MAX_PEM_BYTES),
    ("users", "user", "tokenFile", MAX_TOKEN_BYTES),
    ("users", "user", "client-certificate", MAX_PEM_BYTES),
    ("users", "user", "client-key", MAX_PEM_BYTES),
)
"""(list, entry, key, the most bytes read) of every file path a kubeconfig may name."""


def _parsed(kubeconfig: bytes, name: str) -> object:
    """The kubeconfig's document, or None where the client's own parse should report it.

    Raises:
        ConfigError: a YAML alias (no kubeconfig writer uses them; 709 bytes of them
            expanded to 10^8 entries, and one string aliased 137,500 times to 55 GB in the
            client's merge), or more than ``MAX_ENTRIES`` of a list.
    """
    try:
        parsed = yaml.load(kubeconfig, Loader=_NoAliases)  # a SafeLoader
    except _AliasFoundError as err:
        raise ConfigError(
            f"--kubeconfig {name}: YAML aliases are not read in a kubeconfig"
        ) from err
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
    for listed in ("clusters", "contexts", "users"):
        entries = parsed.get(listed) if isinstance(parsed, dict) else None
        if isinstance(entries, list) and len(entries) > MAX_ENTRIES:
            raise ConfigError(
                f"--kubeconfig {name}: {len(entries):,} {listed}, more than the {MAX_ENTRIES} read"
            )
    return parsed


class _AliasFoundError(Exception):
    """A YAML alias met while composing a kubeconfig."""


class _NoAliases(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing every alias as it is met, before anything is built.

    Found where the YAML is composed, whatever the alias names: a list or mapping met twice
    in the parsed document missed an aliased string (issue 27, hostile pass 5, H1).
    """

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise _AliasFoundError
        return super().compose_node(parent, index)


def _named_files(parsed: object, base: Path) -> list[tuple[Path, str, int]]:
    """(path, key, limit) of each file the kubeconfig names, relative to its directory.

    As the client opens them: joined to the kubeconfig's directory, ``~`` not expanded.
    """
    found: list[tuple[Path, str, int]] = []
    for listed, inner, key, limit in _NAMED_FILES:
        entries = parsed.get(listed) if isinstance(parsed, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            body = entry.get(inner) if isinstance(entry, dict) else None
            path = body.get(key) if isinstance(body, dict) else None
            if isinstance(path, str) and path:
                found.append((base / path, key, limit))
    return found


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class Resource:
    """A kind of object the API serves: group (``""`` for the core group), version, plural."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None) -> str:
        """The collection's URL path, in ``namespace`` or across all of them (None)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CONFIGMAPS = Resource("", "v1", "configmaps")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices")
NODES = Resource("", "v1", "nodes", namespaced=False)
PODS = Resource("", "v1", "pods")
DATASETS = Resource("data.fluid.io", "v1alpha1", "datasets")
"""Fluid's Datasets (v1.0.8): what a runtime caches."""
DATALOADS = Resource("data.fluid.io", "v1alpha1", "dataloads")
"""Fluid's DataLoads: a request to warm a Dataset's cache."""
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects")
"""KEDA's ScaledObjects: which ones exist, and each trigger's metadata."""
_BY_NAME = {"configmaps": CONFIGMAPS, "endpointslices": ENDPOINT_SLICES}


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects to watch: one resource, narrowed by namespace and selectors.

    ``namespace=None`` watches every namespace (or a cluster-scoped resource); the set
    is then keyed ``namespace/name`` for namespaced objects, else by name.
    """

    resource: Resource | Literal["configmaps", "endpointslices"]
    namespace: str | None = None
    label_selector: str = ""
    field_selector: str = ""
    keep: Callable[[RawObject], RawObject] | None = None
    """What of each object the watched set keeps (its name and namespace must stay);
    None: the object less ``metadata.managedFields``."""

    def kept(self, obj: RawObject) -> RawObject:
        """The object as the watched set keeps it."""
        return _kept(obj) if self.keep is None else self.keep(obj)

    @property
    def kind(self) -> Resource:
        """The resource, a short name resolved."""
        return self.resource if isinstance(self.resource, Resource) else _BY_NAME[self.resource]

    def key(self, obj: RawObject) -> str:
        """The object's key in the watched set."""
        meta = obj["metadata"]
        if self.namespace is None and meta.get("namespace"):
            return f"{meta['namespace']}/{meta['name']}"
        return str(meta["name"])

    def checked_key(self, obj: object) -> str | None:
        """The object's key, or None when it is no object with a name to key it by.

        What the API server sends is checked here: a list item or event object that is
        not a mapping, has no ``metadata`` mapping, or whose name (or namespace) is not
        a non-empty string is skipped alone, never the watch.
        """
        if not isinstance(obj, dict):
            return None
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return None
        name, namespace = meta.get("name"), meta.get("namespace")
        if not isinstance(name, str) or not name:
            return None
        if namespace is not None and not isinstance(namespace, str):
            return None
        return self.key(obj)

    def __str__(self) -> str:
        narrowed = ",".join(s for s in (self.label_selector, self.field_selector) if s)
        where = f" in {self.namespace}" if self.namespace is not None else ""
        return f"{self.kind}{where}" + (f" ({narrowed})" if narrowed else "")


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


async def watch_objects(
    access: KubeAccess,
    selection: Selection,
    on_change: Callable[[dict[str, RawObject]], None],
    *,
    resync: float = 300.0,
    reconnect_min: float = 0.5,
    reconnect_max: float = 30.0,
    on_error: Callable[[Exception], None] | None = None,
    on_skip: Callable[[str], None] | None = None,
    on_event: Callable[[str, RawObject | None], None] | None = None,
) -> None:
    """List and watch ``selection`` forever, calling ``on_change`` with every new set.

    ``on_change`` runs after each list and after each watch event, with a dict of
    object key to raw object; it must not block. With ``on_event`` (optional, must not
    block), a watch event calls it instead, with the key and the new object (None:
    deleted), and a list still calls ``on_change``: a caller that keeps its own copy
    reads what changed, not a copy of the whole set each event. ``on_error``
    (optional, must not block) hears each failed list or watch before the backoff (a
    watch ended before it held too): an ``ApiException`` with status 404 means the
    server does not serve the resource. ``on_skip`` (optional) hears the
    reason for each list item or watch event skipped as malformed (``_Skips``).

    Nothing the server answers ends the loop: a list that is not one (no mapping, no
    ``resourceVersion``), nesting past the JSON parser's depth, or any other exception
    is a failed attempt, heard by ``on_error``, logged once a change and retried after
    the backoff; a malformed item or event is skipped alone.
    """
    delay = reconnect_min
    last_problem = ""
    skips = _Skips(selection, on_skip)

    def each(key: str, obj: RawObject | None, objects: dict[str, RawObject]) -> None:
        if on_event is not None:
            on_event(key, obj)
        else:
            on_change(dict(objects))

    # A watch that held this long was a watch: the next list is at once, the backoff
    # starts again. One ended sooner (a proxy closing it, a 410 each time, RBAC that
    # grants list and not watch) relisted ~600 times a second, or warned every try.
    hold = min(reconnect_max, resync / 2)
    loop = asyncio.get_running_loop()
    while True:
        began: float | None = None  # when the current watch started
        try:
            api = await access.client()
        except Exception as err:  # whatever the client raises: this attempt failed, not the loop
            if on_error is not None:
                on_error(err)
            level = logging.ERROR if str(err) != last_problem else logging.DEBUG
            log.log(level, "cannot watch %s: %s; retrying in %.1fs", selection, err, delay)
            last_problem = str(err)
        else:
            try:
                async with api:
                    while True:
                        began = None
                        objects, version = await _list(api, selection, skips)
                        on_change(dict(objects))
                        began = loop.time()
                        how = await _watched(api, selection, objects, version, each, resync, skips)
                        if loop.time() - began < hold:
                            raise _ShortWatchError(how, hold)
                        log.debug("watch on %s %s; listing again", selection, how)
                        delay, last_problem = reconnect_min, ""
            except Exception as err:  # any answer, any bug: this attempt failed, not the loop
                if on_error is not None:
                    on_error(err)
                held = began is not None and loop.time() - began >= hold
                if held and not isinstance(err, _ShortWatchError):
                    delay, last_problem = reconnect_min, ""  # it broke after it held
                problem = f"{type(err).__name__}: {_brief(err)}"
                # The same failure again (a CRD still absent) is logged once, not every try.
                kind = err.how if isinstance(err, _ShortWatchError) else problem
                level = logging.WARNING if kind != last_problem else logging.DEBUG
                log.log(
                    level, "watch on %s failed (%s); retrying in %.1fs", selection, problem, delay
                )
                last_problem = kind
        await asyncio.sleep(delay)
        delay = min(delay * 2, reconnect_max)


class _ShortWatchError(Exception):
    """A watch that ended, or expired (410), before it held: a failed attempt."""

    def __init__(self, how: str, hold: float) -> None:
        # No duration in the text: the same failure again is one log line, not one a try.
        super().__init__(f"the watch {how} within {hold:g}s of its start")
        self.how = how


async def _watched(
    api: client.ApiClient,
    selection: Selection,
    objects: dict[str, RawObject],
    version: str,
    each: Callable[[str, RawObject | None, dict[str, RawObject]], None],
    resync: float,
    skips: _Skips,
) -> str:
    """How ``_watch`` ended: ``ended`` (the server closed it) or ``expired`` (a 410)."""
    try:
        await _watch(api, selection, objects, version, each, resync, skips)
    except GoneError:
        return "expired (410 GoneError)"
    return "ended"


class _Skips:
    """Malformed list items and watch events of one watch: heard, logged once a reason."""

    def __init__(self, selection: Selection, hear: Callable[[str], None] | None) -> None:
        self._selection = selection
        self._hear = hear
        self._logged: set[str] = set()

    def skip(self, reason: str) -> None:
        if self._hear is not None:
            self._hear(reason)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("watch on %s: skipped %s", self._selection, reason)


def _event(line: bytes) -> RawObject | None:
    """One watch line as a JSON mapping, or None (not JSON, nested too deep, no mapping)."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return event if isinstance(event, dict) else None


def _brief(err: Exception) -> str:
    if isinstance(err, client.ApiException):
        return f"{err.status} {err.reason}"
    return str(err)[:300]


async def _get(
    api: client.ApiClient,
    selection: Selection,
    request_timeout: float,
    path: str = "",
    **query: object,
) -> Any:
    """GET the selection's collection (or ``path`` in it); the raw (unread) aiohttp response."""
    params: list[tuple[str, object]] = [
        (name, value)
        for name, value in (
            ("labelSelector", selection.label_selector),
            ("fieldSelector", selection.field_selector),
            *query.items(),
        )
        if value not in ("", None)
    ]
    collection = selection.kind.path(selection.namespace)
    response = await api.call_api(
        f"{collection}/{path}" if path else collection,
        "GET",
        query_params=params,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=request_timeout,
    )
    if not 200 <= response.status <= 299:
        # Unread responses are not checked by the client: an error must not pass as a list.
        error = client.ApiException(status=response.status, reason=response.reason)
        error.body = await _read_capped(response, MAX_ERROR_BYTES, cut=True)
        response.release()
        raise error
    return response


MAX_ERROR_BYTES = 2000
"""Bytes of an error answer kept (its Status message); the rest is never read."""
LIST_PAGE = 100
"""Objects a list asks for per page (``limit``): a large collection comes in pages."""
MAX_ANSWER_BYTES = 160 * MiB
"""Bytes one answer (a list page, a written object) may have: a page of ``LIST_PAGE``
objects at etcd's 1.5 MiB per object, with room. An answer that never ends was read
whole, 1 GiB a second, until memory ran out."""
MAX_LISTED = 500_000
"""Objects one list may hold over all its pages (Kubernetes is tested to 150,000 pods):
a server handing out ``continue`` tokens without end is not a collection."""
MAX_CONTINUE_CHARS = 8192
"""A ``continue`` token's length (the API server's are a few hundred characters): a
token of 1 MiB a page, each kept to spot one coming again, held 1.5 GB by page 1,000
(hostile pass 13)."""
MAX_LIST_BYTES = 4 << 30
"""Bytes of all of one list's pages: each page is bounded, and so is their sum."""
MAX_LIST_PAGES = 2 * MAX_LISTED // LIST_PAGE
"""Pages one list may take: a server may answer short pages, even empty ones, but pages
of nothing with a new ``continue`` token each were asked for without end (14,613 in 10 s,
no error heard; hostile pass 12)."""


class AnswerTooLargeError(ValueError):
    """An API answer longer than its cap: the attempt failed, the rest was never read."""


async def _read_capped(response: Any, limit: int, *, cut: bool = False) -> bytes:
    """The body, read no further than ``limit`` bytes and one chunk.

    Past ``limit``: its first ``limit`` bytes with ``cut``, else ``AnswerTooLargeError``.
    """
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if cut:
                break
            raise AnswerTooLargeError(f"an answer over {limit:,} bytes (not read further)")
    return b"".join(chunks)[:limit]


async def _list(
    api: client.ApiClient, selection: Selection, skips: _Skips
) -> tuple[dict[str, RawObject], str]:
    """The listed objects by key and the list's resourceVersion, page by page.

    Raises:
        ValueError: a page is not a list answer, or is over ``MAX_ANSWER_BYTES``, or the
            pages hold over ``MAX_LISTED`` objects, or there are over ``MAX_LIST_PAGES``
            of them, or a ``continue`` token comes again: the attempt failed.
    """
    items: dict[str, RawObject] = {}
    token, count, size = "", 0, 0
    tokens: set[int] = set()  # hashes: a collision ends one attempt early, no more
    for _ in range(MAX_LIST_PAGES):
        version, listed, token, read = await _page(api, selection, token)
        count += len(listed)
        size += read
        if count > MAX_LISTED:
            raise ValueError(f"the list holds over {MAX_LISTED:,} objects")
        if size > MAX_LIST_BYTES:
            raise ValueError(f"the list's pages hold over {MAX_LIST_BYTES:,} bytes")
        if hash(token) in tokens:
            raise ValueError("the list's continue token came again: its pages would not end")
        tokens.add(hash(token))
        for item in listed:
            key = selection.checked_key(item)
            if key is None:
                skips.skip("a listed item without a name")
            else:
                items[key] = selection.kept(item)
        if not token:
            return items, version
    raise ValueError(f"the list takes over {MAX_LIST_PAGES:,} pages")


async def _page(
    api: client.ApiClient, selection: Selection, token: str
) -> tuple[str, list[Any], str, int]:
    """One page of a list: (resourceVersion, items, the next page's token or "", bytes).

    Raises:
        ValueError: not a list answer (JSON mapping, ``items`` a list or absent, a
            ``resourceVersion`` string), one over ``MAX_ANSWER_BYTES``, or a ``continue``
            token over ``MAX_CONTINUE_CHARS``.
    """
    response = await _get(api, selection, 30, limit=LIST_PAGE, **{"continue": token})
    async with response:
        raw = await _read_capped(response, MAX_ANSWER_BYTES)
        body = json.loads(raw)
    meta = body.get("metadata") if isinstance(body, dict) else None
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    listed = body.get("items") if isinstance(body, dict) else None
    if not isinstance(version, str) or not version or not isinstance(listed, list | None):
        raise ValueError("the list answer has no resourceVersion or items that are not a list")
    following = meta.get("continue") if isinstance(meta, dict) else None
    following = following if isinstance(following, str) else ""
    if len(following) > MAX_CONTINUE_CHARS:
        raise ValueError(f"the list's continue token is over {MAX_CONTINUE_CHARS:,} characters")
    return version, listed or [], following, len(raw)


async def _watch(
    api: client.ApiClient,
    selection: Selection,
    objects: dict[str, RawObject],
    version: str,
    each: Callable[[str, RawObject | None, dict[str, RawObject]], None],
    resync: float,
    skips: _Skips,
) -> None:
    """Apply watch events to ``objects`` until the server ends the watch after ``resync``.

    ``each(key, object or None, objects)`` hears every event once applied.

    An event that is not JSON, not a mapping, or whose object has no name is skipped
    alone; an ERROR event ends the watch (a 410 relists at once).
    """
    response = await _get(
        api,
        selection,
        # The client-side limit only guards against a silently dead connection.
        resync + 30,
        watch="true",
        allowWatchBookmarks="true",
        resourceVersion=version,
        timeoutSeconds=int(resync),
    )
    async with response:
        try:
            async for line in response.content:
                _apply(line, selection, objects, each, skips)
        except asyncio.CancelledError:
            _drop(response)
            raise


def _apply(
    line: bytes,
    selection: Selection,
    objects: dict[str, RawObject],
    each: Callable[[str, RawObject | None, dict[str, RawObject]], None],
    skips: _Skips,
) -> None:
    """One watch line applied to ``objects``; an ERROR event raises."""
    if not line.strip():
        return
    event = _event(line)
    if event is None:
        skips.skip("a watch event that is not a JSON mapping")
        return
    kind, obj = event.get("type"), event.get("object") or {}
    if kind == "ERROR":
        if isinstance(obj, dict) and obj.get("code") == 410:
            raise GoneError
        message = obj.get("message", obj) if isinstance(obj, dict) else obj
        raise ValueError(f"watch error: {str(message)[:300]}")
    if kind == "BOOKMARK":
        return
    name = selection.checked_key(obj)
    if name is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
        skips.skip(f"a {str(kind)[:20]!r} event without a named object")
        return
    if kind == "DELETED":
        objects.pop(name, None)
        each(name, None, objects)
    else:
        if name not in objects and len(objects) >= MAX_LISTED:
            # The list's bound, kept by its watch too: new names without end took memory
            # without end.
            raise ValueError(f"the watch would hold over {MAX_LISTED:,} objects")
        objects[name] = kept = selection.kept(obj)
        each(name, kept, objects)


def _drop(response: aiohttp.ClientResponse) -> None:
    """A watch left mid-stream (its task cancelled, as on a stop): the connection aborted.

    Closed, it went into TLS's close_notify exchange, which aiohttp then tracks nowhere:
    the session's close did not wait for it, and a test's event loop that ended first
    left its socket unclosed (1 run in 60 of an admission test, with the cores busy).
    """
    connection = response.connection
    if connection is not None and connection.protocol is not None:
        connection.protocol.abort()


def _kept(obj: RawObject) -> RawObject:
    """A watched object as kept: without ``metadata.managedFields``, which nothing reads.

    Every writer's field sets are most of a Workload that Kueue and the check both write
    to; a view of 10,000 of them held them all (issue 28's peak RSS).
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


# --- writes -----------------------------------------------------------------------------


async def _request(
    api: client.ApiClient,
    method: str,
    path: str,
    body: RawObject,
    content_type: str,
    query: list[tuple[str, object]],
) -> bytes:
    """A write's 2xx answer, at most ``MAX_ANSWER_BYTES``, unread.

    Raises:
        client.ApiException: any answer but 2xx (its body cut at ``MAX_ERROR_BYTES``).
    """
    response = await api.call_api(
        path,
        method,
        query_params=query,
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=30,
    )
    async with response:
        ok = 200 <= response.status <= 299
        limit = MAX_ANSWER_BYTES if ok else MAX_ERROR_BYTES
        text = await _read_capped(response, limit, cut=not ok)
    if not ok:
        error = client.ApiException(status=response.status, reason=response.reason)
        error.body = text
        raise error
    return text


def _written(text: bytes) -> RawObject:
    """A write's 2xx answer: the object after it, a JSON mapping with its ``metadata``.

    Raises:
        ValueError: anything else. A proxy's ``[]`` to a status apply was kept as the
            Workload's fresher copy and failed every later pass (hostile pass 12).
    """
    answer = json.loads(text)
    if not isinstance(answer, dict) or not isinstance(answer.get("metadata"), dict):
        raise ValueError("the answer to a write is not an object with metadata")
    return answer


async def get_object(
    api: client.ApiClient, resource: Resource, namespace: str | None, name: str
) -> RawObject:
    """One object as the server's JSON, read as a list page is (at most ``MAX_ANSWER_BYTES``).

    Raises:
        client.ApiException: any answer but 2xx (404: not there).
        ValueError: the answer is over ``MAX_ANSWER_BYTES``, not JSON, or not a mapping.
    """
    response = await _get(api, Selection(resource, namespace), 30, path=name)
    async with response:
        body = json.loads(await _read_capped(response, MAX_ANSWER_BYTES))
    if not isinstance(body, dict):
        raise ValueError("the answer is not an object")
    return body


async def apply(
    api: client.ApiClient,
    resource: Resource,
    body: RawObject,
    *,
    field_manager: str,
    subresource: str = "",
    force: bool = True,
) -> RawObject:
    """Server-side apply ``body`` (named by its metadata) and return the object after it.

    Sent as ``application/apply-patch+yaml`` (JSON is YAML) with ``fieldManager`` and
    ``force``; ``subresource="status"`` writes the status subresource. A
    ``metadata.resourceVersion`` in the body is a precondition: a changed object answers
    409.

    Raises:
        client.ApiException: any answer but 2xx (``status`` 409: a conflict).
        ValueError: a 2xx answer over ``MAX_ANSWER_BYTES`` or not an object (``_written``).
    """
    meta = body["metadata"]
    path = f"{resource.path(meta.get('namespace'))}/{meta['name']}"
    if subresource:
        path += f"/{subresource}"
    query: list[tuple[str, object]] = [("fieldManager", field_manager)]
    if force:
        query.append(("force", "true"))
    return _written(await _request(api, "PATCH", path, body, "application/apply-patch+yaml", query))


async def create(api: client.ApiClient, resource: Resource, body: RawObject) -> RawObject:
    """Create ``body`` (in ``metadata.namespace`` for a namespaced resource).

    Raises:
        client.ApiException: any answer but 2xx (``status`` 409: it exists already).
        ValueError: a 2xx answer over ``MAX_ANSWER_BYTES`` or not an object (``_written``).
    """
    path = resource.path(body["metadata"].get("namespace"))
    return _written(await _request(api, "POST", path, body, "application/json", []))


async def delete(
    api: client.ApiClient, resource: Resource, namespace: str | None, name: str, *, uid: str = ""
) -> None:
    """Delete ``name`` (in the background); with ``uid``, only while it is that object.

    The UID precondition keeps a delete from hitting a newer object under the same
    name (one another writer just recreated).

    Raises:
        client.ApiException: any answer but 2xx (404: gone; 409: the UID differs).
    """
    body: RawObject = {"kind": "DeleteOptions", "apiVersion": "v1"}
    body["propagationPolicy"] = "Background"
    if uid:
        body["preconditions"] = {"uid": uid}
    path = f"{resource.path(namespace)}/{name}"
    # A delete's answer is the object, or a Status with no metadata (Kubernetes answers
    # either); nothing reads it, so it is not required to be an object (hostile pass 14).
    await _request(api, "DELETE", path, body, "application/json", [])
