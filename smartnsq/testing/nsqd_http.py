"""Emulated nsqd HTTP API (PROTOCOL.md section 8.5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from smartnsq.testing.http import ApiError, Request, Response, api_response, text_response

if TYPE_CHECKING:
    from smartnsq.testing.nsqd import NsqdNode

__all__ = ["NsqdHttpApi"]


class NsqdHttpApi:
    def __init__(self, node: NsqdNode) -> None:
        self.node = node

    async def handle(self, request: Request) -> Response:
        if request.path == "/ping":
            return text_response("OK")
        if request.path == "/info" and request.method == "GET":
            return api_response(request, self._info())
        raise ApiError(404, "NOT_FOUND")

    def _info(self) -> dict[str, Any]:
        node = self.node
        info: dict[str, Any] = {
            "version": node.settings.version,
            "broadcast_address": node.host,
            "hostname": node.cluster.hostname,
            "http_port": node.http_port,
            "tcp_port": node.tcp_port,
            "start_time": node.start_time,
        }
        if node.settings.youzan:
            info["ha_support"] = True
        return info
