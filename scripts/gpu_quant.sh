#!/usr/bin/env bash
# On the GPU machine, in parts: `xq` sweeps int8 decode in `small` (W decoded in registers against
# x quantized per 16 k with dot4I8Packed) at M = 1, 4, 8, 16 beside f16 on the 1.1B and 7B shapes;
# `bench` benches 1.1B (f16, int8, e4m3; batch 1, 8, 32) and 7B (f16, int8; batch 1), 512-token
# prompts, fallback off; `tests` runs the quantized kernel and engine tests; `sweep` the format,
# q8-shape and crossover sweeps. Prepare here as for scripts/gpu_check.sh:
# `bash ../shared/gpu/prepare.sh && deno install && bash scripts/gpu_trim_modules.sh`, carry
# [".gpu"]. Usage: bash scripts/gpu_quant.sh [xq] [bench] [tests] [sweep] (default xq bench:
# under 8 minutes, steps past BUDGET seconds, default 450, are skipped; results under $OUT:
# log.txt, xq-*.txt, bench-*.json / .txt, test-*.txt, sweep-*.txt)
set -u
if [[ " $* " == *" -h "* || " $* " == *" --help "* ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
for p in "$@"; do
  [[ $p == xq || $p == bench || $p == tests || $p == sweep ]] ||
    { echo "gpu_quant.sh: unknown part '$p' (xq, bench, tests, sweep)" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/strata-gpu}
mkdir -p "$out"
[ -d node_modules ] || cp -a .gpu/nm node_modules
parts=${*:-xq bench}
budget=${BUDGET:-450} # seconds for all the parts asked for (SECONDS counts from the start)
log() { echo "== $(date +%T) $*" | tee -a "$out/log.txt"; }
want() { [[ " $parts " == *" $1 "* ]]; }
# step SECONDS NAME DENO-ARGS...: `deno DENO-ARGS` on the GPU machine under a timeout of SECONDS,
# or of what is left of the budget when that is less; skipped when under 10 s are left.
step() {
  local t=$1 name=$2 left=$((budget - SECONDS))
  shift 2
  ((left < t)) && t=$left
  if ((t < 10)); then log "skipped (budget): $name"; return 0; fi
  log "$name"
  timeout "$t" bash .gpu/run.sh "$@"
}

if want xq; then
  # W decoded in registers ({"xq": false}) against xq (the default for int8), both in the default
  # launch shape, and xq with two units per trip (where K caps the lanes, int8 takes one now);
  # f16 rows beside (xq is a no-op for them). The LM head lines are f16 in every variant.
  v='[{"small": {"xq": false}}, {}, {"small": {"unroll": 2}}]'
  for shape in tinyllama-1.1b llama-7b; do
    step 100 "sweep $shape: int8 small, old decode vs xq, M = 1, 4, 8, 16" \
      run -A --cached-only scripts/sweep_kernels.ts --shape "$shape" --m 1,4,8,16 \
      --quantize none,int8 --variants "$v" --batches "" --iterations 3 > "$out/xq-$shape.txt" 2>&1
    grep -E "^(qkv|o |gate|down)" "$out/xq-$shape.txt" | sed 's/ (matmul.*//' >> "$out/log.txt"
  done
fi

if want bench; then
  # 512-token prompts (the peers' figures), 128 new tokens, no layer at 16 bits (the table says
  # "fallback off"); 7B at batch 1 only (its KV pool of one 2 GiB binding holds 255 blocks of 16).
  bench() { # bench SHAPE QUANTIZE BATCHES SECONDS
    local fb=""
    [[ $2 != none ]] && fb="--quantize-fallback=off"
    step "$4" "bench $1 --quantize $2 --batch $3" run -A --cached-only scripts/bench.ts \
      --shape "$1" --quantize "$2" $fb --batch "$3" --prompt-len 512 --new-tokens 128 \
      --prefill-runs 2 --out "$out/bench-$1-$2.json" > "$out/bench-$1-$2.txt" 2>&1
    grep -E "weights|prefill|decode, batch" "$out/bench-$1-$2.txt" | head -6 | tee -a "$out/log.txt"
  }
  bench tinyllama-1.1b int8 1,8,32 90
  bench tinyllama-1.1b none 1,8,32 90
  bench llama-7b int8 1 100
  bench llama-7b none 1 100
  bench tinyllama-1.1b e4m3 1,8,32 90
fi

if want tests; then
  # --no-check: the trimmed node_modules on the GPU machine has no type declarations.
  step 120 "kernel tests (quantized formats, every path, the GPU's launch shapes)" \
    test -A --cached-only --no-check tests/kernels_quant_test.ts > "$out/test-kernels.txt" 2>&1
  tail -3 "$out/test-kernels.txt" >> "$out/log.txt"
  # (not the CLI and bench tests: their child processes would look for the registry)
  step 150 "engine tests (logprobs against the quantized reference, GGUF, the monitor's fallback)" \
    test -A --cached-only --no-check --filter "/^(--quantize|GGUF|precision)/" tests/quant_engine_test.ts \
    > "$out/test-engine.txt" 2>&1
  grep -E "Δ|passed|FAILED" "$out/test-engine.txt" | tail -8 >> "$out/log.txt"
fi

if want sweep; then
  step 110 "sweep: formats at decode and prefill sizes (1.1B)" \
    run -A --cached-only scripts/sweep_kernels.ts --batches "" --iterations 3 \
    --shape tinyllama-1.1b --m 1,8,16,17,32,512 --quantize none,int8,e4m3 \
    > "$out/sweep-formats.txt" 2>&1
  step 90 "sweep: q8 launch shapes and the f32 path for int8 (1.1B)" \
    run -A --cached-only scripts/sweep_kernels.ts --batches "" --iterations 3 \
    --shape tinyllama-1.1b --m 32,512 --quantize int8 --variants '[{}, {"q8": {"bkw": 4}},
      {"q8": {"bm": 64, "bn": 64, "tm": 8, "tn": 8}}, {"q8": {"bm": 128, "bn": 128, "tm": 8, "tn": 8,
      "splits": 1}}, {"path": "tiled"}]' > "$out/sweep-q8.txt" 2>&1
  step 60 "sweep: small against q8 at 8-16 rows (1.1B)" \
    run -A --cached-only scripts/sweep_kernels.ts --batches "" --iterations 3 \
    --shape tinyllama-1.1b --m 8,12,16 --quantize int8 --variants '[{}, {"path": "q8"}]' \
    > "$out/sweep-crossover.txt" 2>&1
  step 90 "sweep: 7B projections, f16 against int8" \
    run -A --cached-only scripts/sweep_kernels.ts --batches "" --iterations 3 \
    --shape llama-7b --m 1,512 --quantize none,int8 > "$out/sweep-7b.txt" 2>&1
fi
log "done"
