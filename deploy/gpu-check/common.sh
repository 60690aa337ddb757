# Shared by the GPU checks: a file registry, the LiteLLM proxy with KV routing, requests through it compared with an
# aggregated reference, and cleanup. Sourced, not run. Needs: a CUDA machine, the engine under test installed in the
# active Python environment, litellm-disagg installed (pip install -e .), MODEL set to a local model directory.
set -euo pipefail

: "${MODEL:?set MODEL to a local model directory (e.g. a Llama-3.2-1B-Instruct checkout)}"
SERVED="${SERVED:-check-model}"
RUN_DIR="${RUN_DIR:-$(mktemp -d -t litellm-disagg-gpu-check-XXXX)}"
REGISTRY="$RUN_DIR/registry"
PROXY_PORT="${PROXY_PORT:-4400}"
export LITELLM_MASTER_KEY="${LITELLM_MASTER_KEY:-sk-gpu-check}"
export LITELLM_LOCAL_MODEL_COST_MAP=True
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    sleep 5
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    echo "logs: $RUN_DIR"
}
trap cleanup EXIT

# start_worker ENGINE ROLE GPU PORT BOOTSTRAP_OR_NIXL_PORT [-- engine args]
start_worker() {
    local engine=$1 role=$2 gpu=$3 port=$4 xport=$5
    shift 5
    CUDA_VISIBLE_DEVICES=$gpu litellm-disagg worker --engine "$engine" --role "$role" --model "$MODEL" \
        --served-model-name "$SERVED" --host 127.0.0.1 --port "$port" --nixl-port "$xport" \
        --registry-dir "$REGISTRY" --worker-id "$engine-$role-$port" "$@" >"$RUN_DIR/$engine-$role-$port.log" 2>&1 &
    PIDS+=($!)
}

wait_registered() {  # wait_registered COUNT
    for _ in $(seq 1 600); do
        if [ "$(ls "$REGISTRY" 2>/dev/null | grep -c json || true)" -ge "$1" ]; then return 0; fi
        sleep 1
    done
    echo "workers did not register; see $RUN_DIR" >&2
    return 1
}

start_proxy() {  # start_proxy INDEX_MODE (precise: KV events; approximate: none)
    cat >"$RUN_DIR/proxy.yaml" <<YAML
model_list: []
litellm_settings: {callbacks: ["litellm_disagg.plugin.handler"], drop_params: false}
general_settings: {master_key: os.environ/LITELLM_MASTER_KEY}
router_settings: {num_retries: 2, timeout: 600}
litellm_disagg:
  registry: {backend: file, path: "$REGISTRY", poll_interval_s: 0.25}
  kv_routing: {enabled: true, disaggregation: {mode: always}, index: {mode: $1}}
YAML
    python -m litellm.proxy.proxy_cli --config "$RUN_DIR/proxy.yaml" --host 127.0.0.1 --port "$PROXY_PORT" \
        >"$RUN_DIR/proxy.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 180); do
        if curl -sf -H "Authorization: Bearer $LITELLM_MASTER_KEY" "http://127.0.0.1:$PROXY_PORT/v1/models" \
            | grep -q "\"$SERVED\""; then return 0; fi
        sleep 1
    done
    echo "the proxy did not list $SERVED; see $RUN_DIR/proxy.log" >&2
    return 1
}

# compare REFERENCE_BASE_URL: greedy answers through the proxy (disaggregated) must equal the reference's (aggregated)
compare() {
    python - "$1" "http://127.0.0.1:$PROXY_PORT/v1" <<'PY'
import os, sys
import openai

ref = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0, timeout=600)
proxy = openai.OpenAI(base_url=sys.argv[2], api_key=os.environ["LITELLM_MASTER_KEY"], max_retries=0, timeout=600)
model = os.environ.get("SERVED", "check-model")
prompts = ["Explain disaggregated prefill and decode in three sentences.",
           "Write a haiku about KV caches. " * 20,
           "List the planets of the solar system, one per line."]
failed = 0
for i, prompt in enumerate(prompts):
    messages = [{"role": "user", "content": prompt}]
    want = ref.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0).choices[0].message.content
    got = proxy.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0).choices[0].message.content
    stream = proxy.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    ok = want == got == streamed
    failed += not ok
    print(f"prompt {i}: {'SAME' if ok else 'DIFFERENT'}\n  aggregated:    {want!r}\n  disaggregated: {got!r}\n  streamed:      {streamed!r}")
print("PASS" if not failed else f"FAIL ({failed} of {len(prompts)} differ)")
sys.exit(1 if failed else 0)
PY
}
