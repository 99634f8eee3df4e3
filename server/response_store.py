"""Responses kept for `previous_response_id` (/v1/responses with store=true): in memory, at most
`capacity` of them (the oldest goes first), each for `ttl_s` seconds. A stored response keeps the
conversation through its reply as chat messages, so a follow-up renders it again with the chat template;
its KV stays cached under a prompt_cache_key session named by the response id (runtime/kv/pins.py), so the
follow-up's prompt finds that prefix in the radix cache. Thread-safe: whole responses are rendered on the
server's CPU pool, streamed ones on the event loop."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from .config import RESPONSES_STORE_MAX_ITEMS, RESPONSES_STORE_TTL_S


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    messages: list[dict[str, Any]]  # the conversation through this reply (chat messages, no instructions)
    expires: float  # monotonic time


class ResponseStore:
    def __init__(self, capacity: int = RESPONSES_STORE_MAX_ITEMS, ttl_s: float = RESPONSES_STORE_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._expire()
            self._items[response_id] = StoredResponse(body, messages, self.clock() + self.ttl_s)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    def _expire(self) -> None:
        now = self.clock()
        while self._items and next(iter(self._items.values())).expires <= now:  # oldest first: same ttl
            self._items.popitem(last=False)
