"""The HTTP server's settings: the one place they live."""
from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
GRACEFUL_SHUTDOWN_S = 30.0  # on shutdown, requests in flight get this long to finish, then are aborted
SHUTDOWN_MARGIN_S = 5.0  # then this long for the aborted ones to send their last event, then uvicorn cancels
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on `logprobs` / `top_logprobs`
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
METRICS_SAMPLE_INTERVAL_S = 1.0
METRICS_WINDOW_S = 10.0  # tokens/s in /metrics average over this window
HEALTH_TIMEOUT_S = 30.0  # /health fails if the scheduler thread has not answered by then
STEP_LOG_INTERVAL_S = 5.0  # `serve` logs a step line (requests, cache hits, tok/s) this often while busy
REQUEST_LOG_MAX_CHARS = 2000  # --log-requests: a body longer than this is logged truncated
# /v1/responses with store=true: responses kept in memory for previous_response_id, at most this many, each
# for this long (its KV stays pinned for the engine's prompt_cache_retention, usually shorter)
RESPONSES_STORE_MAX_ITEMS = 1024
RESPONSES_STORE_TTL_S = 3600.0
