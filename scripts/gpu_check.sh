#!/usr/bin/env bash
# On the GPU machine: strata vs HF transformers on random TinyLlama- and Qwen2-shape models (the
# TinyLlama one also with an f16 KV cache and at a context of 768) and on the default model, batch
# 32 against batch 1 (scripts/batch_check.ts, contexts 256 and 768), then `deno task bench` on the
# TinyLlama shape. Prepare here with
# `bash ../shared/gpu/prepare.sh && deno install && bash scripts/gpu_trim_modules.sh` and carry
# [".gpu"] (the whole node_modules/ does not fit in the device tool's 64 MiB).
# Usage: bash scripts/gpu_check.sh   (results under $OUT: *.json, log.txt)
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/strata-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -d node_modules ] || cp -a .gpu/nm node_modules
deno() { bash .gpu/run.sh "$@"; }  # the GPU machine reaches no registry: run with --cached-only
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt"; }
prompt="In the beginning God created the heaven and the earth. And the earth was without form, \
and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face"

log "adapter"
deno run -A --cached-only .gpu/ceilings.ts 2>&1 | grep -E "read 1GiB wg=256 unroll=4|matvec|dispatch" | tee -a "$out/log.txt"
for shape in tinyllama qwen2; do
  log "hf_compare $shape"
  timeout 120 python3 scripts/hf_compare.py make --shape "$shape" --out "/tmp/$shape" 2>&1 | tail -2 | tee -a "$out/log.txt"
  # The prompt fifteen times over (~620 tokens): prefill runs the tiled matmul in a chunk of 512
  # rows and one of ~110 (the launch shapes above and below 256 rows, K split or not).
  long="$prompt $prompt $prompt $prompt $prompt"
  timeout 90 bash .gpu/run.sh run -A --cached-only main.ts generate --model "/tmp/$shape" \
    --prompt "$long $long $long" --max-tokens 24 \
    --json > "$out/${shape}_strata.json" 2>>"$out/log.txt"
  timeout 90 python3 scripts/hf_compare.py check --model "/tmp/$shape" --strata "$out/${shape}_strata.json" \
    2>&1 | tail -1 | tee "$out/${shape}_compare.json" | tee -a "$out/log.txt"
done
log "hf_compare tinyllama, f16 KV cache"
timeout 90 bash .gpu/run.sh run -A --cached-only main.ts generate --model /tmp/tinyllama --kv-dtype f16 \
  --prompt "$long $long $long" --max-tokens 24 --json > "$out/tinyllama_kv16_strata.json" 2>>"$out/log.txt"
timeout 90 python3 scripts/hf_compare.py check --model /tmp/tinyllama \
  --strata "$out/tinyllama_kv16_strata.json" 2>&1 | tail -1 | tee -a "$out/log.txt"
log "batch check: batch 32 against alone, tinyllama shape"
timeout 150 bash .gpu/run.sh run -A --cached-only scripts/batch_check.ts --model /tmp/tinyllama --batch 32 \
  --tokens 24 2>>"$out/log.txt" | tee "$out/batch_check.json" | tee -a "$out/log.txt"
# At a context of 768 decode attention takes smaller workgroups: 128 threads in 24 splits alone,
# 64 threads in 8 splits at batch 32 (kernels/attention_decode.ts, decodePlan).
log "hf_compare tinyllama, context 768"
timeout 90 bash .gpu/run.sh run -A --cached-only main.ts generate --model /tmp/tinyllama --context-length 768 \
  --prompt "$long $long $long" --max-tokens 24 --json > "$out/tinyllama_ctx768_strata.json" 2>>"$out/log.txt"
timeout 90 python3 scripts/hf_compare.py check --model /tmp/tinyllama \
  --strata "$out/tinyllama_ctx768_strata.json" 2>&1 | tail -1 | tee -a "$out/log.txt"
log "batch check: batch 32 against alone, context 768, prompts up to 600 tokens"
timeout 150 bash .gpu/run.sh run -A --cached-only scripts/batch_check.ts --model /tmp/tinyllama --batch 32 \
  --tokens 24 --context 768 --prompt-max 600 2>>"$out/log.txt" | tee "$out/batch_check_ctx768.json" |
  tee -a "$out/log.txt"
log "hf_compare default model"
timeout 60 bash .gpu/run.sh run -A --cached-only main.ts generate --prompt "The king said" --max-tokens 40 --json \
  > "$out/default_strata.json" 2>>"$out/log.txt"
timeout 60 python3 scripts/hf_compare.py check --model models/strata-default \
  --strata "$out/default_strata.json" 2>&1 | tail -1 | tee "$out/default_compare.json" | tee -a "$out/log.txt"
log "bench"
timeout 240 bash .gpu/run.sh run -A --cached-only scripts/bench.ts --shape tinyllama-1.1b --batch 1,8,32 --prompt-len 512 \
  --new-tokens 256 --out "$out/bench.json" --profile 2>&1 | tail -120 | tee -a "$out/log.txt"
log "done"
# Long contexts and masks: scripts/gpu_check_long.sh (PART=compare | bench; each one device call).
if [ "${LONG:-0}" = 1 ]; then
  OUT="$out" bash scripts/gpu_check_long.sh
fi
if [ "${SWEEP:-0}" = 1 ]; then
  log "sweep"
  variants=${SWEEP_VARIANTS:-'[{}]'}
  timeout 200 bash .gpu/run.sh run -A --cached-only scripts/sweep_kernels.ts --m 1,2,4,8,16,32,64 \
    --variants "$variants" --batches 1,8,32 --contexts 640,2048,4096 \
    --attn-variants '[{}, {"splitSize": 64}, {"splitSize": 1e9}]' --out "$out/sweep.json" \
    > "$out/sweep.txt" 2>&1
  log "sweep done"
fi
