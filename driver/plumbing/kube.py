"""The Kubernetes API client the driver uses: built once, from a kubeconfig or in-cluster.

The driver talks to the API server through the ``kubernetes`` client's ``ApiClient``
(configuration, auth, connection pool, ``ApiException``), calling the REST paths itself
and reading plain JSON: the typed API classes cost 0.3 s (``ResourceV1Api``) to 0.6 s
(``CoreV1Api``) and 5-20 MiB to import, and their pydantic models would cost more per
request than the request; the publisher compares plain dicts anyway. The test API server
(tests/kubeapi) checks the same calls through the typed classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

#: (connect, read) seconds for every request: a hung API server must not hang the driver.
REQUEST_TIMEOUT = (5.0, 30.0)


class KubeConfigError(RuntimeError):
    """No usable kubeconfig / in-cluster configuration."""


class KubeUnavailable(RuntimeError):
    """The API server did not answer (connection refused, timeout, 5xx)."""


class NodeNotFound(LookupError):
    """The Node named by ``--node-name`` does not exist."""


@dataclass(frozen=True)
class ApiFailure:
    """What a failed request means for a retry loop."""

    status: int | None
    """HTTP status, or None when no answer came (connection refused, reset, timeout)."""
    retry_after: float | None
    message: str

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def transient(self) -> bool:
        """Worth retrying after a backoff: no answer, 429, or a server error."""
        return self.status is None or self.status == 429 or self.status >= 500


def build_api_client(kubeconfig: str | None, user_agent: str | None = None) -> ApiClient:
    """An ``ApiClient`` from ``kubeconfig``, or the in-cluster service account when None.

    ``user_agent``: sent with every request (the driver names its node in it, so that a
    fleet's requests can be told apart in the API server's audit log)."""
    from kubernetes import config
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config.config_exception import ConfigException

    cfg = Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
    except (ConfigException, OSError, ValueError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration"
        raise KubeConfigError(f"cannot load {where}: {exc}") from exc
    # Our loops retry with backoff; urllib3's own quick reconnects would only hide outages.
    cfg.retries = 1
    # One kept-alive connection per concurrent kubelet call (the DRA server's 16 workers):
    # a smaller pool closes the extra ones after use, and each later call opens a new TLS
    # connection.
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 16)
    client = ApiClient(cfg)
    if user_agent:
        client.user_agent = user_agent
    return client


def driver_user_agent(node_name: str) -> str:
    """The User-Agent of ``toposlice run`` on ``node_name``: the API server's audit log
    then tells a fleet's drivers apart (bench/driver_fleet.py counts requests by it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("toposlice")
    except PackageNotFoundError:
        ver = "dev"
    return f"toposlice-run/{ver} (node {node_name})"


def server_url(client: ApiClient) -> str:
    return str(client.configuration.host)


def failure(exc: BaseException) -> ApiFailure:
    """Classify an exception raised by a request."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        headers = exc.headers or {}
        retry_after: float | None = None
        raw = headers.get("Retry-After") if hasattr(headers, "get") else None
        if raw:
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
        message = _status_message(exc.body) or str(exc.reason or "")
        return ApiFailure(exc.status, retry_after, f"HTTP {exc.status}: {message}")
    return ApiFailure(None, None, no_answer_reason(exc))


def no_answer_reason(exc: BaseException) -> str:
    """Why no answer came, in the words of the innermost cause ("Connection refused", "Name
    or service not known", the TLS verification error) rather than urllib3's wrappers, whose
    text repeats the pool, the URL and the retry count in one 300-character line."""
    seen: set[int] = set()
    root: BaseException = exc
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        root = cur
        reason = getattr(cur, "reason", None)  # urllib3's MaxRetryError and friends
        cur = reason if isinstance(reason, BaseException) else (cur.__cause__ or cur.__context__)
    if isinstance(root, OSError) and root.strerror:
        return str(root.strerror)
    return f"{type(root).__name__}: {root}"


def _status_message(body: Any) -> str:
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (TypeError, ValueError):
        return str(body)[:200]
    return str(data.get("message", "")) if isinstance(data, dict) else ""


def request_json(
    client: ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
) -> Any:
    """One request on the client's connection pool, the answer parsed as JSON.

    Raises ``kubernetes.client.ApiException`` for non-2xx answers, as the typed calls do.
    The URL is built here rather than by ``ApiClient.param_serialize``, whose
    ``configuration.host`` re-reads every proxy variable of the environment per call
    (half a millisecond, more than the rest of the client side).
    """
    from kubernetes.client.exceptions import ApiException

    headers = {**client.default_headers, **_auth_headers(client), "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    url = _base_url(client) + path
    if query:
        url += "?" + urlencode(query)
    _note(client, method, path, query)
    resp = client.rest_client.request(
        method, url, headers=headers, body=body, _request_timeout=REQUEST_TIMEOUT
    )
    data = resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException(http_resp=resp)
    return json.loads(data) if data else None


#: HTTP method -> API verb (a GET is get, list or watch by its path and query).
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def on_request(client: ApiClient, hook: Callable[[str, str], None] | None) -> None:
    """Tell ``hook(verb, resource)`` of every request the driver's calls send on
    ``client`` (``toposlice_api_requests_total``; the fleet bench and tests count them)."""
    client.__dict__["_toposlice_on_request"] = hook


def request_verb(method: str, path: str, query: list[tuple[str, str]] | None) -> tuple[str, str]:
    """(verb, resource) of a request, as the API server's metrics name them (lower case):
    ``GET /apis/g/v/resourceslices?watch=true`` is (watch, resourceslices)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if rest else ""
    if method == "GET":
        if len(rest) > 1:
            return "get", resource
        watching = any(k == "watch" and v in ("true", "1") for k, v in query or [])
        return ("watch" if watching else "list"), resource
    return _VERBS.get(method, method.lower()), resource


def _note(client: ApiClient, method: str, path: str, query: list[tuple[str, str]] | None) -> None:
    hook = client.__dict__.get("_toposlice_on_request")
    if hook is not None:
        hook(*request_verb(method, path, query))


#: Seconds the Authorization header is reused. The configuration's refresh hook (which
#: reloads a rotated or expired token) runs at most this often instead of per request:
#: the kubeconfig loader's hook also re-resolves the proxy from the whole environment
#: each time, 0.2 ms per request. Projected tokens are rotated minutes before expiry.
AUTH_TTL_S = 1.0


def _auth_headers(client: ApiClient) -> dict[str, str]:
    cached = client.__dict__.get("_toposlice_auth")
    now = monotonic()
    if cached is not None and now < cached[0]:
        return dict(cached[1])
    headers: dict[str, str] = {}
    client.update_params_for_auth(headers, None, ["BearerToken"], "", "GET", None)
    client.__dict__["_toposlice_auth"] = (now + AUTH_TTL_S, headers)
    return dict(headers)


def _base_url(client: ApiClient) -> str:
    base = client.__dict__.get("_toposlice_base_url")
    if base is None:
        base = str(client.configuration.host).rstrip("/")
        client.__dict__["_toposlice_base_url"] = base
    return str(base)


def get_node(client: ApiClient, name: str) -> dict[str, Any]:
    """The Node object; :class:`NodeNotFound` or :class:`KubeUnavailable` with one clear line."""
    from urllib.parse import quote

    try:
        node: dict[str, Any] = request_json(client, "GET", f"/api/v1/nodes/{quote(name)}")
    except Exception as exc:
        f = failure(exc)
        if f.not_found:
            raise NodeNotFound(f"node {name!r} not found at {server_url(client)}") from exc
        if f.status is None or f.transient:
            raise KubeUnavailable(
                f"API server {server_url(client)} unreachable: {f.message}"
            ) from exc
        raise KubeUnavailable(f"API server {server_url(client)} refused: {f.message}") from exc
    return node


#: The keyword arguments of the typed client's list calls, as query parameters.
_LIST_PARAMS = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "_continue": "continue",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "send_initial_events": "sendInitialEvents",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def collection_lister(client: ApiClient, path: str) -> Callable[..., Any]:
    """A list call of the collection at ``path`` with the typed client's keyword arguments
    (``field_selector``, ``limit``, ``_continue``, ``resource_version``, ``watch``, ...), for
    driver/plumbing/informer.py and ``kubernetes.watch``: it answers the raw urllib3 response
    (``.data``, or the event stream of a watch) and raises ``ApiException`` for non-2xx
    answers, as the typed calls do with ``_preload_content=False``. The driver lists and
    watches its own objects this way without importing the typed API classes (see the
    module docstring)."""
    from kubernetes.client.exceptions import ApiException

    def list_call(
        *, _preload_content: bool = False, _request_timeout: Any = None, **kwargs: Any
    ) -> Any:
        query: list[tuple[str, str]] = []
        for key, value in kwargs.items():
            if key not in _LIST_PARAMS:
                raise TypeError(f"list of {path}: unexpected argument {key!r}")
            if value is None:
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            query.append((_LIST_PARAMS[key], text))
        headers = {**client.default_headers, **_auth_headers(client), "Accept": "application/json"}
        url = _base_url(client) + path + ("?" + urlencode(query) if query else "")
        _note(client, "GET", path, query)
        resp = client.rest_client.request(
            "GET", url, headers=headers, _request_timeout=_request_timeout or REQUEST_TIMEOUT
        )
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException(http_resp=resp)
        return resp.response

    list_call.__name__ = f"list {path}"
    return list_call
