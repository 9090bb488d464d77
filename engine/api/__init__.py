"""The wire format between clients, the gateway and the engine: request models
(``protocol``), the JSON body parser (``jsonbody``), the OpenAI-format error body
(``errors``), every ``X-Shunter-*`` header with its codec (``headers``, ``timing``) and
the engine token's rule (``tokens``).

Gateway, tenants and console import these; nothing outside the engine imports
``engine.server``. No torch, no aiohttp, no Django.
"""
