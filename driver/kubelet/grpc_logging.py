"""Log every kubelet call with an increasing request id, as the Go kubelet-plugin helper
does: one debug line when it arrives, one when it ends (with the duration), one error
line when a handler raised (gRPC then answers UNKNOWN; nothing crashes)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger("driver.grpc")


class LoggingInterceptor(grpc.ServerInterceptor):
    """The wrapped handler is built once per method, not per call, and the debug lines
    cost one level check when debug logging is off."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streams (health) log themselves; unknown methods: gRPC answers
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._logged(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped

    def _logged(
        self, method: str, inner: Callable[[Any, grpc.ServicerContext], Any]
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        ids = self._ids

        def logged(request: Any, context: grpc.ServicerContext) -> Any:
            rid = next(ids)
            debug = log.isEnabledFor(logging.DEBUG)
            start = time.perf_counter() if debug else 0.0
            if debug:
                log.debug("request %d %s", rid, method)
            try:
                response = inner(request, context)
            except Exception:
                log.exception("request %d %s failed", rid, method)
                raise
            if debug:
                log.debug(
                    "request %d %s done in %.1f ms",
                    rid,
                    method,
                    (time.perf_counter() - start) * 1e3,
                )
            return response

        return logged
