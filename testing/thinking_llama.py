"""A tiny random Llama that "thinks": SmolLM2's tokenizer plus `<think>` / `</think>` as added (non-special)
tokens, as Qwen3's vocabulary has them, and a chat template that opens the block in its generation prompt
(DeepSeek-R1's style: `<|im_start|>assistant\\n<think>\\n`). Random weights never close the block, so a test
of thinking budgets sees the engine close it. Written as an HF folder (no download)."""
from __future__ import annotations

import copy
from pathlib import Path

from tokenizers import AddedToken

from ..runtime.tokenizer import Tokenizer
from .random_llama import TINY_CONFIG, smollm2_tokenizer, tiny_weights, write_hf_folder

THINK_MARKERS = ("<think>", "</think>")

# ChatML with tools listed in the system turn (Hermes' calls) and the block opened for the answer
OPENS_THINKING = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\nCall a tool as <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role != 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}{{- message.content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {{- '<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}
"""

THINKING_CONFIG = TINY_CONFIG | {"vocab_size": 49216}  # SmolLM2's 49152 + the two markers, rounded up


def thinking_tokenizer(chat_template: str = OPENS_THINKING) -> Tokenizer:
    tok = smollm2_tokenizer()
    hf = copy.deepcopy(tok.hf)
    hf.add_tokens([AddedToken(m, special=False, normalized=False) for m in THINK_MARKERS])
    return Tokenizer(hf=hf, eos_token_ids=tok.eos_token_ids, bos_token_id=tok.bos_token_id, add_bos=tok.add_bos,
                     chat_template=chat_template)


def write_thinking_model(path: Path, chat_template: str = OPENS_THINKING, seed: int = 0) -> Path:
    """The thinking model as an HF folder at `path`."""
    return write_hf_folder(path, THINKING_CONFIG, tiny_weights(THINKING_CONFIG, seed), thinking_tokenizer(chat_template))
