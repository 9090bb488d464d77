"""Load generator: open-loop arrivals of ``engine.workload``'s requests, a streaming
OpenAI-compatible client and vLLM-compatible reports (``shunter bench serve``). Imports no
Django: benchmark jobs call ``runner.run_rate`` as a library."""
