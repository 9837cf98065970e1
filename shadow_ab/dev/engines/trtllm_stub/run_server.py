# mypy: ignore-errors
# ruff: noqa
"""Start TensorRT-LLM's real OpenAIServer (trtllm-serve's HTTP layer) with a stub generator, on
CPU. Runs in the venv `shadow-ab engine trtllm record` makes, never in the project's own.

usage: TRTLLM_SOURCE=DIR python run_server.py PORT MODEL_DIR
(DIR holds tensorrt_llm/serve/openai_server.py: a source checkout or an unpacked wheel)."""

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trtllm_stubs  # noqa: E402,F401  (must come first)
from stub_llm import StubLLM  # noqa: E402

from tensorrt_llm.serve.openai_server import OpenAIServer  # noqa: E402

port, model_dir = int(sys.argv[1]), sys.argv[2]
llm = StubLLM(model_dir)
server = OpenAIServer(llm=llm, model=model_dir, server_role=None, metadata_server_cfg=None)
asyncio.run(server("127.0.0.1", port))
