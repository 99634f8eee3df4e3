"""Chat templates of each family render exactly as transformers' apply_chat_template renders them.

The templates are written here after each family's published one (same structure and Jinja features:
system handling, role alternation errors, tools as JSON, dates, reasoning blocks), since nothing is downloaded.
"""
from __future__ import annotations

import json

import pytest
import transformers  # noqa: E402

from radixlang.runtime.tokenizer import Tokenizer

from .hf_tiny import write_tokenizer

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# 3.1 fixes the date; 3.2 asks strftime_now for today's; both put tools into the first user turn
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined and use_today %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping %}{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
LLAMA31 = LLAMA31_TEMPLATE.replace("use_today", "false")
LLAMA32 = LLAMA31_TEMPLATE.replace("use_today", "true")

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are Qwen, a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nReturn each call as JSON inside <tool_call></tool_call> tags.<|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# reasoning kept only after the last real user turn; a reversed scan with a namespace finds it
QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, roles must alternate user/assistant') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

TEMPLATES = {  # name -> (template, bos, eos)
    "llama2": (LLAMA2, "<s>", "</s>"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": (LLAMA32, "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (QWEN25, "<|endoftext|>", "<|im_end|>"),
    "qwen3": (QWEN3, "<|endoftext|>", "<|im_end|>"),
    "mistral": (MISTRAL, "<s>", "</s>"),
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city, «quoted» and in UTF-8",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERSATIONS = {
    "single": [{"role": "user", "content": "  Hi there! ¿Qué tal?  "}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": " 4 "}, {"role": "user", "content": "And 3+3?"}],
    "reasoning": [{"role": "user", "content": "Think first."},
                  {"role": "assistant", "content": "<think>\nhm\n</think>\n\nDone."},
                  {"role": "user", "content": "Again."},
                  {"role": "assistant", "content": "Sure.", "reasoning_content": "\nok, again\n"}],
    "reasoning-alias": [{"role": "user", "content": "Why?"},
                        {"role": "assistant", "content": "Because.", "reasoning": "the OpenAI field name"}],
    "tools": [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                  "name": "get_weather", "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"}],
}
# families whose template (like the real one) refuses some conversations
REFUSED = {("llama2", "tools"), ("mistral", "tools")}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def family(request, tmp_path_factory):
    template, bos, eos = TEMPLATES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    write_tokenizer(path, bos, eos, chat_template=template)
    return request.param, transformers.AutoTokenizer.from_pretrained(str(path)), Tokenizer.from_hf_dir(path)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers(family, conversation, add_generation_prompt):
    name, hf_tok, ours = family
    messages = json.loads(json.dumps(CONVERSATIONS[conversation]))
    kwargs = {"tools": [WEATHER_TOOL]} if conversation == "tools" else {}
    if (name, conversation) in REFUSED:
        with pytest.raises(Exception, match="alternate|roles"):
            hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                       **kwargs)
        with pytest.raises(ValueError, match="chat template error: .*(alternate|roles)"):
            ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return
    expected = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                          **kwargs)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs) == expected
    assert ours.encode(expected, add_special_tokens=False) == hf_tok.encode(expected, add_special_tokens=False)


def test_qwen3_thinking_switch_renders_as_transformers(tmp_path):
    write_tokenizer(tmp_path, "<|endoftext|>", "<|im_end|>", chat_template=QWEN3)
    hf_tok, ours = transformers.AutoTokenizer.from_pretrained(str(tmp_path)), Tokenizer.from_hf_dir(tmp_path)
    messages = CONVERSATIONS["single"]
    expected = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=False)
    assert expected.endswith("<think>\n\n</think>\n\n")
    assert ours.apply_chat_template(messages, enable_thinking=False) == expected


def test_loop_controls_and_tojson_options_render_as_transformers(tmp_path):
    """Templates may stop a loop early and sort or compact their JSON, as transformers allows."""
    template = ("{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}"
                "{{ m.role }}: {{ m.content }}\n{% endfor %}"
                "{{ tools | tojson(separators=(',', ':'), sort_keys=true) }}")
    write_tokenizer(tmp_path, "<s>", "</s>", chat_template=template)
    hf_tok, ours = transformers.AutoTokenizer.from_pretrained(str(tmp_path)), Tokenizer.from_hf_dir(tmp_path)
    messages = CONVERSATIONS["system"]
    expected = hf_tok.apply_chat_template(messages, tokenize=False, tools=[WEATHER_TOOL])
    assert "assistant" not in expected and '"required":["city"]' in expected
    assert ours.apply_chat_template(messages, tools=[WEATHER_TOOL]) == expected


# llava-hf's shape: content is a list of typed parts, images first; string content would render as nothing
CONTENT_PARTS = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}"
    "{% endif %}{% for part in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}"
    "{% endfor %}{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ part['text'] + ' ' }}{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def test_a_template_that_reads_content_parts_gets_parts_and_renders_as_transformers(tmp_path):
    write_tokenizer(tmp_path, "<s>", "</s>", chat_template=CONTENT_PARTS)
    hf_tok, ours = transformers.AutoTokenizer.from_pretrained(str(tmp_path)), Tokenizer.from_hf_dir(tmp_path)
    as_strings = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    as_parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in as_strings]
    expected = hf_tok.apply_chat_template(as_parts, tokenize=False, add_generation_prompt=True)
    assert "Hi there" in expected
    assert ours.apply_chat_template(as_strings) == ours.apply_chat_template(as_parts) == expected
    with_images = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "image"},
                                                {"type": "text", "text": "this?"}, {"type": "image"}]}]
    expected = hf_tok.apply_chat_template(with_images, tokenize=False, add_generation_prompt=True)
    assert expected.count("<image>") == 2
    assert ours.apply_chat_template(with_images, image_placeholder="<image>") == expected
    # lang's roles render a sentinel as the content: it comes through as a text part
    from radixlang.lang.chat import ChatTemplate
    prefix, suffix = ChatTemplate(ours.apply_chat_template).affixes("user", [])
    assert (prefix, suffix) == ("USER: ", " ")


def test_a_string_template_gets_image_parts_as_placeholders_one_per_line(tmp_path):
    write_tokenizer(tmp_path, "<s>", "</s>", chat_template=LLAMA3)
    ours = Tokenizer.from_hf_dir(tmp_path)
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    strings = [{"role": "user", "content": "<image>\nand\n<image>"}]
    assert ours.apply_chat_template(parts, image_placeholder="<image>") == ours.apply_chat_template(strings)
    with pytest.raises(ValueError, match="no image placeholder"):
        ours.apply_chat_template(parts)
