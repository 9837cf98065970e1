#!/bin/bash
# Start TensorRT-LLM (the candidate) only once vLLM (the incumbent, same pod, same GPU) is
# healthy: vLLM reserves 0.45 of the GPU's total memory up front and refuses to start when less
# is free, while TensorRT-LLM sizes its KV cache from the memory still free. Starting second makes
# the split the same on every (re)start. Both containers share the pod's network namespace.
set -euo pipefail
until python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  echo "waiting for the incumbent (vLLM) on 127.0.0.1:8000/health before taking GPU memory"
  sleep 5
done
cp /etc/trtllm/extra-llm-api-options.yaml /tmp/extra-llm-api-options.yaml
echo "dtype: ${DTYPE}" >> /tmp/extra-llm-api-options.yaml
exec trtllm-serve "${MODEL}" \
  --host 0.0.0.0 --port 8001 \
  --backend pytorch \
  --max_seq_len "${MAX_MODEL_LEN}" \
  --tp_size 1 \
  --extra_llm_api_options /tmp/extra-llm-api-options.yaml
