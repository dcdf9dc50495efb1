"""ResourceClaims from the API server for NodePrepareResources (the :class:`ClaimReader`).

A GET of ``resource.k8s.io/v1`` ``resourceclaims/<name>``, read as plain API JSON (the
state code reads ``metadata``, ``status.allocation``; parsing pydantic models would cost
more than the request). 404 is :class:`ClaimNotFound`; 429 and 5xx are retried a few
times with a short backoff, well inside the kubelet's 45 s call timeout; anything else is
raised and becomes that claim's error string.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from driver.interfaces import ClaimNotFound
from driver.plumbing.kube import failure, request_json

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
ATTEMPTS = 4
BASE_DELAY_S = 0.1
MAX_DELAY_S = 1.0


class KubeClaimReader:
    def __init__(
        self,
        client: ApiClient,
        *,
        attempts: int = ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.attempts = max(1, attempts)
        self.sleep = sleep

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = CLAIM_PATH.format(namespace=quote(namespace, safe=""), name=quote(name, safe=""))
        for attempt in range(self.attempts):
            try:
                claim: dict[str, Any] = request_json(self.client, "GET", path)
                return claim
            except Exception as exc:
                f = failure(exc)
                if f.not_found:
                    raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None
                if not f.transient or attempt == self.attempts - 1:
                    raise RuntimeError(
                        f"GET ResourceClaim {namespace}/{name}: {f.message}"
                    ) from exc
                delay = BASE_DELAY_S * (2**attempt) * (0.5 + random.random() / 2)
                if f.retry_after is not None:
                    delay = max(delay, f.retry_after)
                self.sleep(min(delay, MAX_DELAY_S))
        raise AssertionError("unreachable")
