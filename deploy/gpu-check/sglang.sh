#!/usr/bin/env bash
# SGLang P/D pair (bootstrap rooms, NIXL) behind the LiteLLM proxy with litellm-disagg, on 3 GPUs:
# GPU 0 prefill, GPU 1 decode, GPU 2 an aggregated reference (--disaggregation-mode null). Greedy answers through
# the proxy must equal the reference's. Then the failure path: a decode request whose room no prefill fills is
# aborted through /abort_request, which must end it with an error status (what the router relies on).
#   MODEL=/models/Llama-3.2-1B-Instruct bash deploy/gpu-check/sglang.sh
# Needs: pip install "sglang[all]" nixl (CUDA), pip install -e . (litellm-disagg).
source "$(dirname "$0")/common.sh"

start_worker sglang prefill 0 30100 8998 --kv-events-port 5557
start_worker sglang decode 1 30200 8999 --kv-events-port 5558
CUDA_VISIBLE_DEVICES=2 python -m sglang.launch_server --model-path "$MODEL" --served-model-name "$SERVED" \
    --host 127.0.0.1 --port 30300 >"$RUN_DIR/reference.log" 2>&1 &
PIDS+=($!)
wait_registered 2
start_proxy precise
for _ in $(seq 1 300); do curl -sf http://127.0.0.1:30300/health >/dev/null && break; sleep 1; done

compare http://127.0.0.1:30300/v1

echo "--- abort of a decode waiting for a room no prefill fills"
python - <<'PY'
import asyncio, httpx

async def main():
    async with httpx.AsyncClient(timeout=60) as c:
        body = {"model": "check-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 12345, "rid": "gpu-check-abort"}
        waiting = asyncio.create_task(c.post("http://127.0.0.1:30200/v1/chat/completions", json=body))
        await asyncio.sleep(2)
        print("abort:", (await c.post("http://127.0.0.1:30200/abort_request", json={"rid": "gpu-check-abort"})).status_code)
        r = await asyncio.wait_for(waiting, 30)
        print("aborted decode answered", r.status_code, r.text[:300])
        print("ABORT OK" if r.status_code >= 400 else "ABORT ANSWERS 200: the router's abort needs another signal")

asyncio.run(main())
PY
