"""The tiny model's chat template: ChatML turns with Hermes-style tool calls (Qwen2.5 / Qwen3 layout).

Reasoning (`reasoning_content`) is kept in every assistant turn, not only the last one, so that the rendering
of a longer conversation always extends the rendering of a shorter one token for token (agent trajectories
are merged on that prefix property).
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\\n\\n"
    "You can call functions to help with the request. Their signatures are listed one per line, "
    "as JSON, between <tools></tools> tags:\\n<tools>"
)
TOOLS_SUFFIX = (
    "\\n</tools>\\n\\n"
    "To call a function, write a JSON object with its name and its arguments between <tool_call></tool_call> "
    "tags, one object per call:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call>"
)

# Jinja source. Helpers: `text_of` flattens string-or-parts content; tool calls accept the OpenAI shape
# ({"function": {"name", "arguments"}}) or a flat {"name", "arguments"}; arguments may be a dict or a JSON string.
CHAT_TEMPLATE = (
    "{%- macro text_of(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part is string -%}{{- part -}}"
    "{%- elif part.text is defined and part.text is not none -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set msgs = messages -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if msgs and msgs[0].role == 'system' -%}"
    "{{- text_of(msgs[0].content) + '\\n\\n' -}}"
    "{%- set msgs = msgs[1:] -%}"
    "{%- endif -%}"
    "{{- '" + TOOLS_PREAMBLE + "' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '" + TOOLS_SUFFIX + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in msgs -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text_of(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.reasoning_content is defined and message.reasoning_content -%}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- text_of(message.content) -}}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if loop.first and text_of(message.content) -%}{{- '\\n' -}}{%- elif not loop.first -%}{{- '\\n' -}}"
    "{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text_of(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
