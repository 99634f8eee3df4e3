"""The protocol views on a chat reply that reasons, says something and calls a tool - the shape a reasoning
model's chat stream has (`delta.reasoning_content`, `delta.content`, `delta.tool_calls`): the streamed events
go through each SDK's own stream accumulator, and what it assembles equals the whole reply's body."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from radixlang.server.agent_protocol import MessagesRequest, ResponsesRequest
from radixlang.server.messages_api import MessagesView
from radixlang.server.openai_params import Job
from radixlang.server.response_store import ResponseStore
from radixlang.server.responses_api import ResponsesView

openai = pytest.importorskip("openai", reason="its stream accumulator is the oracle of the Responses events")
anthropic = pytest.importorskip("anthropic", reason="its stream accumulator is the oracle of the Messages events")

CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
ARGS = '{"city": "Paris"}'
DELTAS = [{"reasoning_content": "Let me "}, {"reasoning_content": "think."}, {"content": "Calling."},
          {"tool_calls": [CALL]}, {"tool_calls": [{"index": 0, "function": {"arguments": ARGS}}]}]
USAGE = {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17, "prompt_tokens_details": {"cached_tokens": 4}}
MESSAGE = {"role": "assistant", "reasoning_content": "Let me think.", "content": "Calling.",
           "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]}


class ChatReply:
    """What _ChatView renders for the reply above: a chunk event per delta, the usage, the whole body."""

    def __init__(self) -> None:
        self.events = [[{"choices": [{"index": 0, "delta": d, "finish_reason": None}]}] for d in DELTAS]
        self.events.append([{"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls",
                                          "matched_stop": None}]}])

    def render(self, k, chunk):
        return self.events.pop(0)

    def finish(self):
        return [{"choices": [], "usage": USAGE}]

    def whole(self, results):
        return {"choices": [{"index": 0, "message": MESSAGE, "finish_reason": "tool_calls", "matched_stop": None}],
                "usage": USAGE}


def views(cls, tokenizer, **fields):
    """The view twice: for the stream and for the whole reply."""
    state = SimpleNamespace(engine=SimpleNamespace(tokenizer=tokenizer))
    return [cls(state, None, Job("x", [[1] * 10]), inner=ChatReply(), **fields) for _ in range(2)]


def streamed(view) -> list[dict]:
    events = view.start()
    for _ in range(len(DELTAS) + 1):
        events += view.render(0, None)
    return events + view.finish()


def test_messages_view_reasoning_text_and_tool_use(tokenizer):
    body = MessagesRequest(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    stream_view, whole_view = views(MessagesView, tokenizer, request_body=body, message_id="msg_1")
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    for event in streamed(stream_view):
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs={})
    whole = whole_view.whole([])
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use"]
    assert snapshot.content[0].thinking == "Let me think." and snapshot.content[2].input == {"city": "Paris"}
    assert snapshot.stop_reason == whole["stop_reason"] == "tool_use"
    assert snapshot.usage.input_tokens == 6 and snapshot.usage.cache_read_input_tokens == 4
    assert snapshot.model_dump(exclude_none=True)["content"] == whole["content"]


def test_responses_view_reasoning_text_and_function_call(tokenizer):
    body = ResponsesRequest(model="m", input="hi", store=False)
    stream_view, whole_view = views(ResponsesView, tokenizer, request_body=body, response_id="resp_1",
                                    conversation=[], store=ResponseStore())
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    accumulator = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    events = streamed(stream_view)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        fired = accumulator.handle_event(construct_type(type_=ResponseStreamEvent, value=event))
    final = fired[-1].response
    whole = whole_view.whole([])
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Let me think." and final.output_text == "Calling."
    assert json.loads(final.output[2].arguments) == {"city": "Paris"} and final.output[2].call_id == "call_1"
    assert final.usage.input_tokens_details.cached_tokens == 4
    assert [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]] == \
        [{k: v for k, v in item.items() if k != "id"} for item in
         (i.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for i in final.output)]


def test_response_store_keeps_the_newest_within_its_bound_and_ttl():
    now = [0.0]
    store = ResponseStore(capacity=2, ttl_s=10.0, clock=lambda: now[0])
    for i in range(3):
        now[0] += 1.0
        store.put(f"r{i}", {"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1").body == {"id": "r1"} and len(store) == 2
    now[0] = 12.5  # r1 expired at 12.0, r2 expires at 13.0
    assert store.get("r1") is None and store.get("r2") is not None
    assert store.delete("r2") and not store.delete("r2") and len(store) == 0
