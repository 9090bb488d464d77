"""The executor's benchmarks on a real model: ``shunter bench executor`` (engine tokens/s
against transformers, and a decode step's cost with KV rotation, ``executor``) and
``shunter bench remap-exec`` (a decode step with remapped layers streamed against none,
``remap_exec``); ``cli`` adds their commands."""
