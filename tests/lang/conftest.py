"""Language tests share one tiny engine (building one takes about a second); each test starts with an
empty prefix cache and ends with the KV memory invariant checked."""
from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import radixlang as rl


@pytest.fixture(scope="session")
def shared_tiny_engine(tiny_model_dir):
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu")
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture
def engine(shared_tiny_engine):
    shared_tiny_engine.flush_cache()
    yield shared_tiny_engine
    shared_tiny_engine.check_invariants()


@pytest.fixture
def backend(engine) -> rl.EngineBackend:
    return rl.EngineBackend(engine)


@pytest.fixture(scope="session")
def oracle_engine(tiny_model_dir):
    """The same tiny model without a prefix cache: every request computes its prompt from scratch."""
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu", disable_radix_cache=True)
    yield engine
    engine.check_invariants()
    engine.shutdown()


# ---- a stand-in for runtime/server's native API, for the Endpoint client -------------------------------
# It speaks the /generate contract the client is written against (SGLang's native API: {"text",
# "output_ids", "meta_info": {prompt_tokens, cached_tokens, completion_tokens, finish_reason,
# input_token_logprobs, output_token_logprobs}}, streamed as server-sent events with cumulative text),
# so the client is tested now; tests/e2e runs the same checks against the real server once it exists.
def _meta(completion, finish_reason: dict, logprobs: bool) -> dict[str, Any]:
    m = completion.meta
    meta = {"id": m.rid, "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_tokens,
            "completion_tokens": m.completion_tokens, "finish_reason": finish_reason}
    if logprobs:
        meta["input_token_logprobs"] = [[lp.logprob, lp.token_id, None] for lp in m.input_logprobs or []]
        meta["output_token_logprobs"] = [[lp.logprob, lp.token_id, None] for lp in m.output_logprobs or []]
    return meta


class ContractServer:
    def __init__(self, engine):
        self.engine = engine
        self.requests: list[tuple[str, Any]] = []
        self.model_info = True  # False: GET /get_model_info answers 404
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                tok = server.engine.tokenizer
                server.requests.append((self.path, None))
                if not server.model_info:
                    self._json(404, {"detail": "Not Found"})
                    return
                self._json(200, {"model_path": server.engine.model_name, "chat_template": tok.chat_template,
                                 "bos_token": tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None
                                 else "", "eos_token": tok.id_to_token(tok.eos_token_ids[0])})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, body))
                try:
                    if self.path == "/generate":
                        server.generate(self, body)
                    elif self.path == "/flush_cache":
                        self._json(200, {"flushed": server.engine.flush_cache()})
                    elif self.path == "/v1/programs":
                        server.programs(self, body)
                    else:
                        self._json(404, {"error": {"message": f"no route {self.path}"}})
                except ValueError as e:
                    self._json(400, {"error": {"message": str(e)}})

            def _json(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def sse_start(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()

            def sse(self, obj: Any) -> None:
                self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def generate(self, handler, body: dict[str, Any]) -> None:
        kwargs = {"return_logprob": body.get("return_logprob", False),
                  "logprob_start_len": body.get("logprob_start_len", -1),
                  "top_logprobs_num": body.get("top_logprobs_num", 0)}
        params = body.get("sampling_params") or {}
        if body.get("stream"):
            chunks = self.engine.stream(body.get("text"), params, input_ids=body.get("input_ids"), **kwargs)
            first = next(chunks)  # validation errors become a 400 before the stream starts
            handler.sse_start()
            text, ids = "", []
            for chunk in itertools.chain([first], chunks):
                text += chunk.text
                ids += chunk.token_ids
                meta = {"prompt_tokens": chunk.prompt_tokens, "cached_tokens": chunk.cached_tokens,
                        "completion_tokens": chunk.completion_tokens,
                        "finish_reason": {"type": chunk.finish_reason, "matched": chunk.matched_stop}
                        if chunk.finished else None}
                handler.sse({"text": text, "output_ids": ids, "meta_info": meta})
            handler.sse(b"[DONE]")
            return
        out = self.engine.generate(body.get("text"), params, input_ids=body.get("input_ids"), **kwargs)
        outs = out if isinstance(out, list) else [out]
        results = [{"text": c.text, "output_ids": c.output_ids,
                    "meta_info": _meta(c, {"type": c.meta.finish_reason}, kwargs["return_logprob"])} for c in outs]
        handler._json(200, results if isinstance(out, list) else results[0])

    def programs(self, handler, body: dict[str, Any]) -> None:
        events = rl.run_ir(body["program"], body.get("args", {}), rl.EngineBackend(self.engine),
                           body.get("sampling_params"))
        handler.sse_start()
        for event in events:
            handler.sse(event.to_dict())
        handler.sse(b"[DONE]")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def contract_server(engine):
    server = ContractServer(engine)
    yield server
    server.close()
