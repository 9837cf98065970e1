"""Stub modules that let TensorRT-LLM's own HTTP layer (``tensorrt_llm/serve/``) run on a CPU.

Not imported by the project: ``run_server.py`` runs them in the venv that
``shadow-ab engine trtllm record`` makes (:mod:`shadow_ab.dev.engines.trtllm_serve`), with the
TensorRT-LLM source tree named by ``$TRTLLM_SOURCE``.
"""
