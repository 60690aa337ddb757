#!/usr/bin/env bash
# vLLM with NixlPushConnector (vLLM >= 0.32: the prefill side WRITEs KV into blocks the decode side holds) on 3 GPUs:
# GPU 0 prefill, GPU 1 decode, GPU 2 an aggregated reference. litellm-disagg's vLLM protocol is the pull one
# (sequential: prefill, then decode with the prefill's kv_transfer_params); this script records whether a push
# connector pair serves correctly under that protocol, and the same with the pull connector for comparison. Wiring
# a push protocol into the router (decode-first or concurrent) is not done yet: the README's table says "not yet".
#   MODEL=/models/Llama-3.2-1B-Instruct bash deploy/gpu-check/vllm-push.sh
# Needs: pip install vllm nixl (CUDA), pip install -e . (litellm-disagg).
source "$(dirname "$0")/common.sh"

PUSH='{"kv_connector":"NixlPushConnector","kv_role":"kv_both","kv_buffer_device":"cuda"}'
start_worker vllm prefill 0 8201 5601 -- --kv-transfer-config "$PUSH"
start_worker vllm decode 1 8202 5602 -- --kv-transfer-config "$PUSH"
CUDA_VISIBLE_DEVICES=2 python -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name "$SERVED" \
    --host 127.0.0.1 --port 8203 >"$RUN_DIR/reference.log" 2>&1 &
PIDS+=($!)
wait_registered 2
start_proxy approximate
for _ in $(seq 1 600); do curl -sf http://127.0.0.1:8203/health >/dev/null && break; sleep 1; done

compare http://127.0.0.1:8203/v1 || echo "push connector under the pull protocol: FAIL (expected until a push protocol exists)"
