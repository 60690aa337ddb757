#!/usr/bin/env bash
# TensorRT-LLM context/generation pair (disaggregated_params, NIXL cache transceiver) behind the LiteLLM proxy with
# litellm-disagg, on 3 GPUs: GPU 0 context, GPU 1 generation, GPU 2 an aggregated reference (plain trtllm-serve).
# Greedy answers through the proxy must equal the reference's.
#   MODEL=/models/Llama-3.2-1B-Instruct bash deploy/gpu-check/trtllm.sh
# Needs: pip install tensorrt-llm (CUDA; NIXL as its cache transceiver backend), pip install -e . (litellm-disagg).
source "$(dirname "$0")/common.sh"

start_worker trtllm prefill 0 8101 1 # the transfer port is unused by TensorRT-LLM
start_worker trtllm decode 1 8102 1
CUDA_VISIBLE_DEVICES=2 trtllm-serve "$MODEL" --host 127.0.0.1 --port 8103 --backend pytorch \
    >"$RUN_DIR/reference.log" 2>&1 &
PIDS+=($!)
wait_registered 2
start_proxy approximate  # trtllm-serve publishes no KV event stream
for _ in $(seq 1 600); do curl -sf http://127.0.0.1:8103/health >/dev/null && break; sleep 1; done

compare http://127.0.0.1:8103/v1
