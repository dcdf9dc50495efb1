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
    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streams (health) log themselves; unknown methods: gRPC answers
        method = handler_call_details.method
        inner = handler.unary_unary

        def logged(request: Any, context: grpc.ServicerContext) -> Any:
            rid = next(self._ids)
            start = time.perf_counter()
            log.debug("request %d %s", rid, method)
            try:
                response = inner(request, context)
            except Exception:
                log.exception("request %d %s failed", rid, method)
                raise
            log.debug(
                "request %d %s done in %.1f ms", rid, method, (time.perf_counter() - start) * 1e3
            )
            return response

        return grpc.unary_unary_rpc_method_handler(
            logged,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
