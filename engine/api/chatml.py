"""ChatML with tools, the chat template of the models ``shunter model init`` writes and of
a model directory that has none: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message,
then ``<|im_start|>assistant\\n``. With tools it follows the Hermes convention that
Qwen2.5 and Qwen3 use: the tools are listed in a system turn inside ``<tools></tools>``,
an assistant's calls are ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
lines, and a tool's answer comes back in a user turn inside ``<tool_response>``."""

CHATML_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'You may call one or more functions. Function signatures are within <tools></tools>:"
    "\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nFor each call, return a JSON object within <tool_call></tool_call> tags:"
    '\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call><|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content']"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": '"
    " + (call['function']['arguments'] if call['function']['arguments'] is string"
    " else (call['function']['arguments'] | tojson)) + '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
