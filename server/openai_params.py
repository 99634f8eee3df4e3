"""OpenAI request -> engine arguments: prompts, chat template, request ids, the routes' checks."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Collection

from ..runtime.multimodal.prompt import ImagePrompts
from ..runtime.sampling_params import RULES
from ..runtime.tokenizer import Tokenizer
from .config import MAX_TOP_LOGPROBS
from .errors import APIError, user_errors
from .image_input import prepare_images
from .protocol import OPENAI_NAMES, ChatMessage
from .text_input import check_unicode, encode_texts
from .tool_calls import ToolPlan, template_messages

# engine field -> the name the client used, for error messages (routes add their own)
FIELDS = {name: OPENAI_NAMES.get(name, name) for name in RULES} | {"input_ids": "prompt"}


@dataclass
class Job:
    """One OpenAI request as the engine runs it: every prompt x n samples."""

    id: str
    prompts: list[list[int]]
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    image_data: list[Any] | None = None  # the prompt's images (decoded), one per placeholder
    cache_key: str | None = None  # prompt_cache_key: the finished sequence stays cached for the session
    priority: int = 0  # SGLang's field: larger is admitted first (runtime/scheduling/schedule_policy.py)
    lora: str | None = None  # the LoRA adapter the request's model names (None: the base model)
    created: int = field(default_factory=lambda: int(time.time()))
    n: int = 1  # samples per prompt: set once the request is validated

    @property
    def rids(self) -> list[str]:
        return [self.id] if len(self.prompts) == 1 else [f"{self.id}-{i}" for i in range(len(self.prompts))]


def new_id(prefix: str, sep: str = "-") -> str:
    """A fresh id in the protocol's shape: Chat Completions' `chatcmpl-...`; Responses' and Messages' `resp_...`,
    `msg_...` (sep "_")."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def check_model(model: str, served: str, adapters: Collection[str] = (), lora_path: str | None = None) -> str | None:
    """The LoRA adapter a request runs (None: the base model): `model` names the base (its name or 'default'),
    an adapter (vLLM's convention) or BASE:ADAPTER (SGLang's); SGLang's `lora_path` names one too. A 404 names
    a model or adapter that is not served."""
    adapter = _model_adapter(model, served, adapters)
    if lora_path is not None:
        if adapter is not None and adapter != lora_path:
            raise APIError(400, f"model names adapter {adapter!r} but lora_path {lora_path!r}; name one", "lora_path")
        return lora_path  # checked where the request is built (a 404 if not loaded)
    return adapter


def _model_adapter(model: str, served: str, adapters: Collection[str]) -> str | None:
    if model in (served, "default"):
        return None
    if model in adapters:
        return model
    for base in (served, "default"):
        if model.startswith(base + ":") and len(model) > len(base) + 1:
            name = model[len(base) + 1:]
            if name in adapters:
                return name
            raise APIError(404, f"LoRA adapter {name!r} is not loaded; loaded: {', '.join(sorted(adapters)) or 'none'}",
                           "model", kind="not_found_error")
    names = "".join(f", {a!r}" for a in sorted(adapters))
    raise APIError(404, f"model {model!r} is not served here; use {served!r} (or 'default'){names}", "model",
                   kind="not_found_error")


def check_top_logprobs(value: int | None, param: str) -> None:
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{param} must be in [0, {MAX_TOP_LOGPROBS}], got {value}", param)


def num_prompts(prompt: str | list) -> int:
    """How many prompts /v1/completions' `prompt` holds: a string or a list of token ids is one."""
    return 1 if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else len(prompt)


def completion_prompts(tokenizer: Tokenizer, prompt: str | list, context_length: int
                       ) -> tuple[list[list[int]], list[str] | None]:
    """Token ids of each prompt of /v1/completions, and their texts when given as text. Slow on long
    texts: call it on a worker thread."""
    batched = not isinstance(prompt, str)
    prompts: list[Any] = [prompt] if isinstance(prompt, str) else prompt
    if not prompts:
        raise APIError(400, "prompt must not be empty", "prompt")
    if isinstance(prompts[0], str):
        return encode_texts(tokenizer, prompts, "prompt", batched, context_length), list(prompts)
    return ([prompts] if isinstance(prompts[0], int) else prompts), None


def chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage], context_length: int,
                image_prompts: ImagePrompts | None = None, model: str = "",
                tools: ToolPlan | None = None, template_kwargs: dict[str, Any] | None = None
                ) -> tuple[list[int], list[Any]]:
    """The conversation rendered with the model's chat template, ready for the assistant's turn, and its
    images (prepared for the engine), each where a placeholder stands in the text. Slow on long conversations and on
    images: call it on a worker thread."""
    rendered = []
    sources: list[Any] = []
    params: list[str] = []
    for i, m in enumerate(messages):
        message = {"role": m.role, "content": _message_content(m, i, sources, params, image_prompts is not None, model)}
        if m.name is not None:
            check_unicode(m.name, f"messages[{i}].name")
            message["name"] = m.name
        for key in ("reasoning_content", "reasoning"):
            if (thinking := getattr(m, key)) is not None:
                check_unicode(thinking, f"messages[{i}].{key}")
                message[key] = thinking
        rendered.append(message)
    images = prepare_images(image_prompts, model, sources, params)
    rendered, extra = template_messages(messages, rendered, tools)
    with user_errors({}):
        placeholder = image_prompts.placeholder if image_prompts is not None else None
        text = tokenizer.apply_chat_template(rendered, image_placeholder=placeholder, **(template_kwargs or {}), **extra)
    return encode_texts(tokenizer, [text], "messages", False, context_length)[0], images


def _message_content(m: ChatMessage, i: int, sources: list[Any], params: list[str], takes_images: bool,
                     model: str) -> str | list[dict[str, str]]:
    """The message's text, or its parts (text, and `{"type": "image"}` for each image, whose URL goes to
    `sources`); the chat template renders either."""
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        check_unicode(m.content, f"messages[{i}].content")
        return m.content
    parts = []
    for j, part in enumerate(m.content):
        param = f"messages[{i}].content[{j}]"
        if part.get("type") == "image_url":
            if not takes_images:
                raise APIError(400, f"only text content parts are supported: model {model!r} has no vision "
                                    "tower, so it takes no images", param)
            parts.append({"type": "image"})
            sources.append(_image_url(part, param))
            params.append(f"{param}.image_url.url")
            continue
        if part.get("type") != "text" or not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
            raise APIError(400, f"only text and image_url content parts ({{'type': 'text', 'text': ...}}, "
                                f"{{'type': 'image_url', 'image_url': {{'url': ...}}}}) are supported, "
                                f"got type {part.get('type')!r}", param)
        check_unicode(part["text"], f"{param}.text")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _image_url(part: dict[str, Any], param: str) -> object:  # unchecked: prepare_images checks each source
    image_url = part.get("image_url")
    if set(part) != {"type", "image_url"} or not isinstance(image_url, dict) or "url" not in image_url \
            or set(image_url) - {"url", "detail"}:
        raise APIError(400, "an image_url part is {'type': 'image_url', 'image_url': {'url': 'data:image/...;"
                            "base64,...'}}", param)
    return image_url["url"]
