#!/usr/bin/env bash
# On the GPU machine: the quantized kernels and engine against their float64 references, then the
# bench on the TinyLlama-1.1B and Llama-2-7B shapes with the projections as loaded (f16), int8 and
# e4m3 in one run, then kernel sweeps (formats, q8 launch shapes, the small / q8 crossover).
# Prepare here as for scripts/gpu_check.sh:
# `bash ../shared/gpu/prepare.sh && deno install && bash scripts/gpu_trim_modules.sh`, carry
# [".gpu"]. Usage: bash scripts/gpu_quant.sh [tests] [bench] [sweep]   (default all three, about
# nine minutes on the H200; results under $OUT: log.txt, bench-*.json / .txt, sweep-*.txt)
set -u
if [[ " $* " == *" -h "* || " $* " == *" --help "* ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
for p in "$@"; do
  [[ $p == tests || $p == bench || $p == sweep ]] || { echo "gpu_quant.sh: unknown part '$p' (tests, bench, sweep)" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/strata-gpu}
mkdir -p "$out"
[ -d node_modules ] || cp -a .gpu/nm node_modules
parts=${*:-tests bench sweep}
run() { bash .gpu/run.sh run -A --cached-only "$@"; }
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt"; }
want() { [[ " $parts " == *" $1 "* ]]; }

if want tests; then
  log "kernel tests (quantized formats, every path, the GPU's launch shapes)"
  timeout 120 bash .gpu/run.sh test -A --cached-only tests/kernels_quant_test.ts > "$out/test-kernels.txt" 2>&1
  tail -3 "$out/test-kernels.txt" | tee -a "$out/log.txt"
  log "engine tests (logprobs against the quantized reference, GGUF, the monitor's fallback)"
  # (not the CLI test: its child processes would look for the registry)
  timeout 150 bash .gpu/run.sh test -A --cached-only --filter "/^(--quantize|GGUF|precision)/" tests/quant_engine_test.ts \
    > "$out/test-engine.txt" 2>&1
  grep -E "Δ|passed|FAILED" "$out/test-engine.txt" | tail -8 | tee -a "$out/log.txt"
fi

if want bench; then
  # 512-token prompts (the peers' figures), 128 new tokens; 7B at batch 1 only (a 7B KV pool of one
  # 2 GiB binding holds 255 blocks of 16 tokens: batch 32 x 640 tokens would queue).
  for q in none int8 e4m3; do
    log "bench tinyllama-1.1b --quantize $q"
    timeout 100 run scripts/bench.ts --shape tinyllama-1.1b --quantize "$q" --batch 1,8,32 \
      --prompt-len 512 --new-tokens 128 --out "$out/bench-1.1b-$q.json" > "$out/bench-1.1b-$q.txt" 2>&1
    grep -E "prefill|decode|weights|bytes" "$out/bench-1.1b-$q.txt" | head -8 | tee -a "$out/log.txt"
  done
  for q in none int8 e4m3; do
    log "bench llama-7b --quantize $q"
    timeout 90 run scripts/bench.ts --shape llama-7b --quantize "$q" --batch 1 --prompt-len 512 \
      --new-tokens 128 --out "$out/bench-7b-$q.json" > "$out/bench-7b-$q.txt" 2>&1
    grep -E "prefill|decode|weights|bytes" "$out/bench-7b-$q.txt" | head -8 | tee -a "$out/log.txt"
  done
fi

if want sweep; then
  log "sweep: formats at decode and prefill sizes (1.1B)"
  timeout 110 run scripts/sweep_kernels.ts --shape tinyllama-1.1b --m 1,8,16,17,32,512 \
    --quantize none,int8,e4m3 --batches "" --iterations 3 > "$out/sweep-formats.txt" 2>&1
  log "sweep: q8 launch shapes and the f32 path for int8; small against q8 at 8-16 rows"
  timeout 90 run scripts/sweep_kernels.ts --shape tinyllama-1.1b --m 32,512 --quantize int8 \
    --batches "" --iterations 3 --variants '[{}, {"q8": {"bkw": 4}},
      {"q8": {"bm": 64, "bn": 64, "tm": 8, "tn": 8}}, {"q8": {"bm": 128, "bn": 128, "tm": 8, "tn": 8,
      "splits": 1}}, {"path": "tiled"}]' > "$out/sweep-q8.txt" 2>&1
  timeout 60 run scripts/sweep_kernels.ts --shape tinyllama-1.1b --m 8,12,16 --quantize int8 \
    --batches "" --iterations 3 --variants '[{}, {"path": "q8"}]' > "$out/sweep-crossover.txt" 2>&1
  log "sweep: 7B projections, f16 against int8"
  timeout 90 run scripts/sweep_kernels.ts --shape llama-7b --m 1,512 --quantize none,int8 \
    --batches "" --iterations 3 > "$out/sweep-7b.txt" 2>&1
  log "sweep done"
fi
log "done"
