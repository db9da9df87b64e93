#!/usr/bin/env bash
# On the GPU machine: long contexts and attention masks (docs/long_context.md). Prepared as
# scripts/gpu_check.sh is (carry [".gpu"]); each part fits one 10-minute device call.
#   PART=compare  strata vs HF transformers: a Mistral whose sliding_window (200) is far shorter
#                 than its 3000-token prompt (f32 and f16 KV, prefill chunks of 512 and 96),
#                 TinyLlama with linear (x4, 6k prompt) and yarn (x16, 30k prompt) rope scaling
#   PART=bench    scripts/bench_masks.ts (the mask's own cost; windowed time flat in length) and
#                 scripts/bench_long.ts at 8k / 32k / 128k, causal, window 4096, sinks 4 + window
# Usage: PART=compare bash scripts/gpu_check_long.sh; PART=bench bash scripts/gpu_check_long.sh
#        (default: both, which may pass 10 minutes). Results under $OUT: *.json, long_log.txt
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/strata-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -d node_modules ] || cp -a .gpu/nm node_modules
log() { echo "== $(date +%T) $*" | tee -a "$out/long_log.txt"; }
part=${PART:-all}

# strata generates after a seeded random prompt (scripts/long_generate.ts), HF checks it.
compare() { # name model attn strata-args...
  local name=$1 model=$2 attn=$3
  shift 3
  log "compare $name"
  timeout 240 bash .gpu/run.sh run -A --cached-only scripts/long_generate.ts --model "$model" "$@" \
    > "$out/${name}_strata.json" 2>>"$out/long_log.txt"
  timeout 240 python3 scripts/hf_compare.py check --model "$model" --strata "$out/${name}_strata.json" \
    ${attn:+--attn $attn} 2>&1 | tail -1 | tee "$out/${name}_compare.json" | tee -a "$out/long_log.txt"
}

if [ "$part" = all ] || [ "$part" = compare ]; then
  for shape in mistral-window tinyllama-linear tinyllama-yarn; do
    log "make $shape"
    timeout 180 python3 scripts/hf_compare.py make --shape "$shape" --out "/tmp/$shape" 2>&1 | tail -1 |
      tee -a "$out/long_log.txt"
  done
  compare mistral_window /tmp/mistral-window eager --prompt-len 3000 --max-tokens 32
  compare mistral_window_kv16 /tmp/mistral-window eager --prompt-len 3000 --max-tokens 32 --kv-dtype f16
  compare mistral_window_chunk96 /tmp/mistral-window eager --prompt-len 1000 --max-tokens 32 --max-chunk 96
  compare tinyllama_linear /tmp/tinyllama-linear "" --prompt-len 6000 --max-tokens 24
  compare tinyllama_yarn /tmp/tinyllama-yarn "" --prompt-len 30000 --max-tokens 16 --kv-dtype f16
fi

if [ "$part" = all ] || [ "$part" = bench ]; then
  log "bench_masks"
  timeout 200 bash .gpu/run.sh run -A --cached-only scripts/bench_masks.ts --out "$out/bench_masks.json" 2>&1 |
    tee -a "$out/long_log.txt"
  log "bench_long causal"
  timeout 240 bash .gpu/run.sh run -A --cached-only scripts/bench_long.ts --prompt-len 8192,32768,131072 \
    --out "$out/bench_long_causal.json" 2>&1 | tee -a "$out/long_log.txt"
  log "bench_long window 4096"
  timeout 120 bash .gpu/run.sh run -A --cached-only scripts/bench_long.ts --prompt-len 8192,32768,131072 \
    --window 4096 --out "$out/bench_long_window.json" 2>&1 | tee -a "$out/long_log.txt"
  log "bench_long sinks 4 + window 4092, batch 4"
  timeout 120 bash .gpu/run.sh run -A --cached-only scripts/bench_long.ts --prompt-len 8192,32768 \
    --window 4092 --sinks 4 --batch 4 --out "$out/bench_long_sinks.json" 2>&1 | tee -a "$out/long_log.txt"
fi
log "done"
