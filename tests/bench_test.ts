/**
 * The bench end to end on the `tiny` synthetic shape (function and CLI), the random-weight fill
 * kernel against a TypeScript reference, and the bench's arithmetic on hand-made inputs.
 */
import assert from "node:assert/strict";
import { createStorage, readBuffer } from "../gpu/device.ts";
import { decode, type DType } from "../gpu/dtype.ts";
import { shapeConfig } from "../engine/model/synthetic.ts";
import { run } from "../gpu/dispatch.ts";
import { fillRandomDispatch } from "../kernels/fill_random.ts";
import { runBench } from "../scripts/bench.ts";
import {
  bursts,
  bytesPerToken,
  decodeRate,
  formatBursts,
  percentile,
} from "../scripts/bench_report.ts";
import { testGpu } from "./util.ts";

/** PCG hash as in kernels/fill_random.wgsl. */
function pcg(x: number): number {
  const s = (Math.imul(x >>> 0, 747796405) + 2891336453) >>> 0;
  const w = Math.imul(((s >>> ((s >>> 28) + 4)) ^ s) >>> 0, 277803737) >>> 0;
  return ((w >>> 22) ^ w) >>> 0;
}

/** Float64 reference of fill_random: element i before rounding to the storage dtype. */
function fillRef(count: number, seed: number, scale: number, center: number): Float64Array {
  const k = pcg((seed ^ 0x9e3779b9) >>> 0);
  return Float64Array.from({ length: count }, (_, i) => {
    const u = (pcg((pcg(i) ^ k) >>> 0) >>> 8) * (2 / 16777216) - 1;
    return center + scale * u;
  });
}

Deno.test("fill_random matches its reference in f32, f16, bf16 (odd count, zero pad)", async () => {
  const gpu = await testGpu();
  const count = 1001, seed = 42;
  for (
    const [dtype, scale, center, tol] of [
      ["f32", 0.05, 1, 1e-7],
      ["f16", 0.02, 0, 2 ** -11],
      ["bf16", 0.5, 0, 2 ** -8],
    ] as [DType, number, number, number][]
  ) {
    const buf = createStorage(gpu, 4096);
    await run(gpu, [fillRandomDispatch(gpu, buf, { count, dtype, scale, center, seed })]);
    const raw = new Uint8Array(await readBuffer(gpu, buf, 4096));
    const got = decode(raw, dtype, count);
    const want = fillRef(count, seed, scale, center);
    let worst = 0;
    for (let i = 0; i < count; i++) {
      assert.ok(Number.isFinite(got[i]), `${dtype} [${i}] = ${got[i]}`);
      const d = Math.abs(got[i] - want[i]);
      worst = Math.max(worst, d / Math.abs(want[i]));
      assert.ok(
        d <= tol * Math.abs(want[i]) + 1e-7,
        `${dtype} [${i}]: got ${got[i]} want ${want[i]}`,
      );
    }
    const mean = got.reduce((s, v) => s + v, 0) / count;
    assert.ok(Math.abs(mean - center) < scale * 0.1, `${dtype} mean ${mean}`);
    if (dtype !== "f32") assert.equal(raw[2 * count] | raw[2 * count + 1], 0, "padding half");
    console.log(`fill_random ${dtype}: max rel err ${worst.toExponential(2)}, mean ${mean}`);
  }
});

Deno.test("bench: runBench on the tiny shape reports every field", async () => {
  const gpu = await testGpu();
  const r = await runBench({
    shape: "tiny",
    batch: [1, 2],
    promptLen: 8,
    newTokens: 8,
    readBytes: 16 * 2 ** 20,
    prefillRuns: 2,
    profile: gpu.hasTimestamps,
    sessions: 2,
    kvWarmMb: 0, // every stored block goes on to a file
    worker: true,
    gpu,
  });
  console.log(JSON.stringify({ ...r, profile: undefined }));
  assert.equal(r.model, "synthetic-tiny-f16");
  assert.equal(r.adapter, gpu.adapterName);
  assert.equal(r.shape, "tiny");
  assert.deepEqual(r.batch, [1, 2]);
  assert.deepEqual(Object.keys(r.decode_tok_s), ["1", "2"]);
  const positive = {
    prefill_tok_s: r.prefill_tok_s,
    decode_1: r.decode_tok_s["1"],
    decode_2: r.decode_tok_s["2"],
    ttft_ms: r.ttft_ms,
    ttft_new_length_ms: r.ttft_new_length_ms ?? NaN,
    ms_per_token_p95: r.ms_per_token_p95,
    step_ms_p50: r.step_ms_p50,
    bytes_per_token: r.bytes_per_token,
    read_bandwidth_gb_s: r.read_bandwidth_gb_s,
    roofline_fraction: r.roofline_fraction,
  };
  for (const [k, v] of Object.entries(positive)) {
    assert.ok(Number.isFinite(v) && v > 0, `${k} = ${v}`);
  }
  assert.ok(r.ms_per_token_p50 >= 0 && r.ms_per_token_p50 <= r.ms_per_token_p95);
  assert.ok(r.roofline_fraction < 5, `roofline fraction ${r.roofline_fraction} is implausible`);
  assert.equal(r.bursts.reduce((a, b) => a + b, 0), 8);
  assert.equal(r.queue_depth, 2);
  assert.equal(r.max_chunk, 256);
  for (const b of ["1", "2"]) {
    const ms = r.host_ms_per_step[b];
    assert.ok(ms > 0 && ms < 10_000, `host ms per step at batch ${b}: ${ms}`);
    const lag = r.event_loop_lag_ms[b];
    assert.ok(
      lag.p50 > 0 && lag.p50 <= lag.p95 && lag.p95 <= lag.max,
      `event-loop lag at batch ${b}: ${JSON.stringify(lag)}`,
    );
  }
  // The sessions scenario: a generation beside two sessions' turns, snapshotted.
  const s = r.sessions!;
  assert.equal(s.sessions, 2);
  assert.equal(s.turn_tokens, 2);
  assert.ok(s.decode_tok_s > 0 && s.flush_ms >= 0, JSON.stringify(s));
  const l = s.event_loop_lag_ms;
  assert.ok(l.p50 > 0 && l.p50 <= l.p95 && l.p95 <= l.max, JSON.stringify(l));
  const sl = s.snapshot_lag_ms;
  assert.ok(sl.p50 >= 0 && sl.p50 <= sl.max, JSON.stringify(sl));
  assert.equal(s.warm_mb, 0);
  const stored = s.stored_blocks.kv + s.stored_blocks.fs; // files or on their way there
  assert.ok(stored >= 2, JSON.stringify(s.stored_blocks));
  // The same measurements with the engine in a worker: every batch, the scenario too.
  const w = r.worker!;
  assert.ok(w.ttft_ms > 0, JSON.stringify(w));
  assert.deepEqual(Object.keys(w.decode_tok_s), ["1", "2"]);
  assert.deepEqual(Object.keys(w.event_loop_lag_ms), ["1", "2"]);
  for (const v of Object.values(w.decode_tok_s)) assert.ok(v > 0, JSON.stringify(w));
  assert.equal(w.sessions?.sessions, 2);
  assert.ok(w.sessions!.snapshot_lag_ms.max >= 0, JSON.stringify(w.sessions));
  assert.equal(r.prompt_len, 8);
  assert.equal(r.new_tokens, 8);
  assert.equal(r.deno, Deno.version.deno);
  assert.ok(!Number.isNaN(Date.parse(r.date)));
  if (gpu.hasTimestamps) {
    // One decode step per batch size (1, 2), then one prefill chunk of the 8-token prompt.
    assert.deepEqual(r.profile?.map((p) => [p.slots, p.context, p.prefill ?? false]), [
      [1, 12, false],
      [2, 12, false],
      [1, 8, true],
    ]);
    for (const p of r.profile!) {
      assert.ok(p.kernels.some((k) => k.label.startsWith("matmul")), "profile has matmuls");
      assert.ok(p.kernels.every((k) => !/ L\d+/.test(k.label)), "layer numbers are summed over");
      assert.ok(p.sumUs > 0 && p.onePassUs > 0);
    }
    assert.ok(r.profile![2].kernels.some((k) => k.label.startsWith("attention T≤8 ")));
  }
});

Deno.test("bench: the CLI writes valid JSON with --out", async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata-bench-" });
  try {
    const out = `${dir}/bench.json`;
    const script = new URL("../scripts/bench.ts", import.meta.url).pathname;
    const cmd = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", script, "--shape", "tiny", "--batch", "1", "--prompt-len", "8"]
        .concat(["--new-tokens", "4", "--read-mib", "8", "--max-chunk", "4", "--out", out]),
      stdout: "piped",
      stderr: "piped",
    });
    const { code, stdout, stderr } = await cmd.output();
    const text = new TextDecoder().decode(stdout);
    assert.equal(code, 0, new TextDecoder().decode(stderr));
    assert.match(text, /decode, batch 1 +[\d.]+ tok\/s/);
    assert.match(text, /roofline fraction/);
    const json = JSON.parse(await Deno.readTextFile(out));
    for (const key of ["model", "adapter", "date", "deno", "shape", "batch"]) {
      assert.ok(json[key] !== undefined, `missing ${key}`);
    }
    for (const key of ["prefill_tok_s", "ttft_ms", "bytes_per_token", "read_bandwidth_gb_s"]) {
      assert.ok(Number.isFinite(json[key]) && json[key] > 0, `${key} = ${json[key]}`);
    }
    assert.ok(json.decode_tok_s["1"] > 0);
    assert.equal(json.max_chunk, 4); // the 8-token prompt prefilled in two chunks
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bench: usage errors name the flag", async () => {
  await assert.rejects(() => runBench({ model: "x", shape: "tiny" }), /--model DIR or --shape/);
  await assert.rejects(() => runBench({ dtype: "bf16" }), /--dtype applies to --shape only/);
  await assert.rejects(() => runBench({ shape: "tiny", newTokens: 1 }), /--new-tokens/);
  await assert.rejects(() => runBench({ shape: "tiny", maxChunk: 0 }), /--max-chunk/);
  await assert.rejects(() => runBench({ shape: "tiny", sessions: -1 }), /--sessions/);
  await assert.rejects(() => runBench({ shape: "tiny", kvWarmMb: -1 }), /--kv-warm-mb/);
  assert.throws(() => shapeConfig("llama-70b"), /unknown shape 'llama-70b': use one of/);
});

Deno.test("bench arithmetic: bytes per token of TinyLlama meet the DESIGN.md roofline", () => {
  const cfg = shapeConfig("tinyllama-1.1b");
  const b = bytesPerToken(cfg, { dtype: "f16" }, 128 + 256 / 2);
  // 22 × (2560 + 2048 + 11264 + 2048·2.75) × 2048 + 32000 × 2048 (LM head), × 2 bytes
  assert.ok(Math.abs(b.weights - 2.069e9) < 0.002e9, `weights ${b.weights}`);
  assert.equal(b.kv, 22 * 2 * 4 * 64 * 4 * 256);
  const roofline = 4.46e12 / b.total; // DESIGN.md: ≈ 2000 tok/s at 4.46 TB/s
  assert.ok(roofline > 1900 && roofline < 2200, `roofline ${roofline} tok/s`);
});

Deno.test("bench arithmetic: bursts, decode rate and percentiles", () => {
  const arrivals = [10, 20, 30, 30.01, 50, 50.01, 50.02, 50.03];
  assert.deepEqual(bursts(arrivals).map((b) => b.tokens), [1, 1, 2, 4]);
  assert.equal(formatBursts([1, 1, 2, 32, 32, 32]), "1,1,2,32×3");
  // Two requests: the window opens when both have a first token (t = 20).
  const rate = decodeRate([
    { t0: 0, arrivals: [10, 30, 40] },
    { t0: 0, arrivals: [20, 30, 40] },
  ]);
  assert.equal(rate, 4 / 0.02);
  // Tokens delivered with the first one are not timed.
  const late = decodeRate([{ t0: 0, arrivals: [5, 5.1, 20, 30] }]);
  assert.ok(Math.abs(late - 2 / 0.0249) < 1e-6, `rate ${late}`);
  assert.throws(() => decodeRate([{ t0: 0, arrivals: [5, 5.3] }]), /raise --new-tokens/);
  assert.equal(percentile([3, 1, 2], 50), 2);
  assert.equal(percentile([0, 10], 95), 9.5);
  assert.equal(percentile([], 50), 0);
});
