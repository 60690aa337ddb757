#!/usr/bin/env bash
# vLLM with NixlPushConnector (vLLM >= 0.32: the prefill side WRITEs KV into blocks the decode side holds) on 3 GPUs:
# GPU 0 prefill, GPU 1 decode (both `litellm-disagg worker --kv-transfer push`), GPU 2 an aggregated reference. The
# router orchestrates the pair concurrently (engines/vllm/push.py: the decode request names the prefill engine's
# published NIXL engine id, the prefill runs in the background); outputs through the proxy are compared with the
# reference. On CPU the same flow is tested by tests/test_e2e_vllm_push.py.
#   MODEL=/models/Llama-3.2-1B-Instruct bash deploy/gpu-check/vllm-push.sh
# Needs: pip install vllm nixl (CUDA), pip install -e . (litellm-disagg).
source "$(dirname "$0")/common.sh"

start_worker vllm prefill 0 8201 5601 --kv-transfer push
start_worker vllm decode 1 8202 5602 --kv-transfer push
CUDA_VISIBLE_DEVICES=2 python -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name "$SERVED" \
    --host 127.0.0.1 --port 8203 >"$RUN_DIR/reference.log" 2>&1 &
PIDS+=($!)
wait_registered 2
start_proxy approximate
for _ in $(seq 1 600); do curl -sf http://127.0.0.1:8203/health >/dev/null && break; sleep 1; done

compare http://127.0.0.1:8203/v1
