/**
 * The bench end to end on the `tiny` synthetic shape (function and CLI), the random-weight fill
 * kernel against a TypeScript reference, and the bench's arithmetic on hand-made inputs.
 */
import assert from "node:assert/strict";
import { createStorage, isCpuAdapter, readBuffer } from "../gpu/device.ts";
import { decode, type DType } from "../gpu/dtype.ts";
import { shapeConfig } from "../engine/model/synthetic.ts";
import { run } from "../gpu/dispatch.ts";
import { fillRandomDispatch } from "../kernels/fill_random.ts";
import { lagProbe, runBench } from "../scripts/bench.ts";
import {
  CPU_DEFAULTS,
  GPU_DEFAULTS,
  parseFlags,
  USAGE,
  withDefaults,
} from "../scripts/bench_options.ts";
import { BenchProgress } from "../scripts/bench_progress.ts";
import {
  bursts,
  bytesPerToken,
  decodeRate,
  DurationHistogram,
  formatBursts,
  percentile,
} from "../scripts/bench_report.ts";
import { taskPermissions, testGpu } from "./util.ts";

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

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
    delivery_gap_ms_p50: r.delivery_gap_ms_p50,
    delivery_gap_ms_p95: r.delivery_gap_ms_p95,
    step_ms_p50: r.step_ms_p50,
    bytes_per_token: r.bytes_per_token,
    read_bandwidth_gb_s: r.read_bandwidth_gb_s,
    roofline_fraction: r.roofline_fraction,
  };
  for (const [k, v] of Object.entries(positive)) {
    assert.ok(Number.isFinite(v) && v > 0, `${k} = ${v}`);
  }
  assert.ok(r.delivery_gap_ms_p50 <= r.delivery_gap_ms_p95);
  // A delivery gap spans at least one decode step (K tokens of a burst arrive together).
  assert.ok(r.delivery_gap_ms_p50 >= r.step_ms_p50, `${r.delivery_gap_ms_p50} ${r.step_ms_p50}`);
  assert.equal(r.cpu_adapter, isCpuAdapter(gpu));
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
      args: [
        "run",
        ...taskPermissions("bench"),
        script,
        "--shape",
        "tiny",
        "--batch",
        "1",
        "--prompt-len",
        "8",
      ]
        .concat(["--new-tokens", "4", "--read-mib", "8", "--max-chunk", "4", "--out", out]),
      stdout: "piped",
      stderr: "piped",
    });
    const { code, stdout, stderr } = await cmd.output();
    const text = new TextDecoder().decode(stdout);
    const errors = new TextDecoder().decode(stderr);
    assert.equal(code, 0, errors);
    assert.match(text, /decode, batch 1 +[\d.]+ tok\/s/);
    assert.match(text, /time between deliveries p50 \/ p95 \(batch 1\) +[\d.]+ \/ [\d.]+ ms/);
    assert.match(text, /roofline fraction/);
    assert.doesNotMatch(text, /ms\/token/, "the old per-token figure (0.00 inside bursts) is gone");
    // stderr is no terminal here: no progress, nothing at all.
    assert.equal(errors, "");
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

Deno.test({
  name: "bench: progress on a terminal shows the stage, its tokens and the time",
  ignore: !exists("/usr/bin/script"), // util-linux's script gives the child a terminal
  async fn() {
    const script = new URL("../scripts/bench.ts", import.meta.url).pathname;
    const bench = [
      Deno.execPath(),
      "run",
      ...taskPermissions("bench"),
      script,
      "--shape",
      "tiny",
      "--batch",
      "1,2",
    ]
      .concat(["--prompt-len", "8", "--new-tokens", "4", "--read-mib", "8"]).join(" ");
    const cmd = new Deno.Command("/usr/bin/script", {
      args: ["-qec", `${bench} 2>&1 >/dev/null`, "/dev/null"], // the terminal shows stderr only
      stdout: "piped",
      stderr: "piped",
    });
    const { code, stdout } = await cmd.output();
    const text = new TextDecoder().decode(stdout);
    assert.equal(code, 0, text);
    // Each stage's last state, as the terminal shows it once the line is rewritten in place.
    const lines = text.split("\n").map((l) => l.split("\r").filter((p) => p.trim()).at(-1) ?? "")
      .map((l) => l.replaceAll("\x1b[K", "").trim()).filter((l) => l.startsWith("bench ["));
    const stages = lines.map((l) => l.replace(/ \(\d+s\)$/, ""));
    assert.deepEqual(stages, [
      "bench [1/6] loading shape tiny (f16)",
      "bench [2/6] read bandwidth (8 MiB)",
      "bench [3/6] warming up (pipelines compile on first use): 13/13 tokens",
      "bench [4/6] prefill of 8 tokens: 6/6 runs",
      "bench [5/6] decode, batch 1 x 4 tokens: 4/4 tokens",
      "bench [6/6] decode, batch 2 x 4 tokens: 8/8 tokens",
    ]);
    assert.ok(lines.every((l) => / \(\d+s\)$/.test(l)), "each line shows the time so far");
  },
});

Deno.test("bench: --help lists every flag with its default, and the environment", async () => {
  const script = new URL("../scripts/bench.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...taskPermissions("bench"), script, "--help"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const help = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0);
  assert.equal(help.trim(), USAGE);
  const flags = [...USAGE.matchAll(/^ {2}(--[a-z-]+)/gm)].map((m) => m[1]);
  const parsed = Object.keys(parseFlags([]).options).map((k) =>
    `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`
  ).map((f) => (f === "--read-bytes" ? "--read-mib" : f));
  for (const flag of parsed) assert.ok(flags.includes(flag), `--help lacks ${flag}`);
  for (const line of USAGE.split("\n").filter((l) => /^ {2}--[a-z]/.test(l))) {
    const flag = line.trim().split(" ")[0];
    const modes = ["--speculate", "--constrained", "--resume"];
    if (["--model", "--shape", "--out", "--profile", "--worker", ...modes].includes(flag)) {
      continue;
    }
    const text = USAGE.slice(USAGE.indexOf(line)).split("\n  --")[0];
    assert.match(text, /default/, `${flag} has no default in --help`);
  }
  assert.match(USAGE, /CPU 1,4\)/);
  assert.match(USAGE, /Environment:\n {2}DENO_WEBGPU_BACKEND .*\n {2}XDG_RUNTIME_DIR/);
});

Deno.test("bench: defaults are the adapter's, and flags given win", () => {
  const cpu = withDefaults({}, true), gpu = withDefaults({}, false);
  assert.deepEqual([cpu.batch, cpu.promptLen, cpu.newTokens, cpu.cpu], [
    [...CPU_DEFAULTS.batch],
    CPU_DEFAULTS.promptLen,
    CPU_DEFAULTS.newTokens,
    true,
  ]);
  assert.deepEqual([gpu.batch, gpu.promptLen, gpu.newTokens], [[1, 8, 32], 128, 256]);
  assert.deepEqual(GPU_DEFAULTS.batch, [1, 8, 32]);
  const given = withDefaults({ batch: [16], promptLen: 512, newTokens: 64 }, true);
  assert.deepEqual([given.batch, given.promptLen, given.newTokens], [[1, 16], 512, 64]);
  assert.equal(parseFlags(["--prefill-runs", "5"]).options.prefillRuns, 5);
  assert.throws(() => parseFlags(["--new-tokens", "many"]), /--new-tokens must be an integer/);
  assert.throws(() => parseFlags(["--bogus"]), /bogus/);
});

Deno.test("bench: event-loop lag is kept in constant memory, percentiles within a bin", async () => {
  // 200 000 samples, as a 20-minute run takes: no list, no Math.max(...list) stack overflow.
  const h = new DurationHistogram(), values: number[] = [];
  let x = 1;
  for (let i = 0; i < 200_000; i++) {
    x = (x * 48271) % 2147483647;
    const v = i % 1000 === 0 ? 250 + (x % 1000) : 1.5 + (x % 10_000) / 1000; // rare long stalls
    h.add(v);
    values.push(v);
  }
  const s = h.summary();
  assert.equal(s.count, 200_000);
  assert.equal(s.max, values.reduce((m, v) => Math.max(m, v), 0));
  for (const [got, p] of [[s.p50, 50], [s.p95, 95]] as const) {
    const want = percentile(values, p);
    assert.ok(Math.abs(got - want) / want < 0.025, `p${p}: ${got} against ${want}`);
  }
  assert.deepEqual(new DurationHistogram().summary(), { p50: 0, p95: 0, max: 0, count: 0 });
  const one = new DurationHistogram();
  one.add(0);
  one.add(3);
  assert.deepEqual([one.percentile(0), one.percentile(100)], [0, 3], "clamped to what was seen");
  // The probe itself: setTimeout(0) takes a while, never nothing.
  const probe = lagProbe();
  await new Promise((r) => setTimeout(r, 50));
  const lag = await probe.stop();
  assert.ok(
    lag.count > 5 && lag.p50 > 0 && lag.p50 <= lag.p95 && lag.p95 <= lag.max,
    JSON.stringify(lag),
  );
});

Deno.test("bench: progress counts stages and units, and writes nothing without a terminal", () => {
  const written: string[] = [];
  const p = new BenchProgress(3, { write: (t) => written.push(t), redrawMs: 0 });
  p.stage("loading");
  p.stage("decode, batch 2", 4);
  p.tick(3);
  p.tick();
  p.end();
  p.end(); // nothing open: nothing more
  const text = written.join("").replace(/ \(\d+s\)/g, "");
  assert.equal(
    text,
    "bench [1/3] loading\n" +
      "\rbench [2/3] decode, batch 2: 0/4 tokens\x1b[K" +
      "\rbench [2/3] decode, batch 2: 3/4 tokens\x1b[K" +
      "\rbench [2/3] decode, batch 2: 4/4 tokens\x1b[K" +
      "\rbench [2/3] decode, batch 2: 4/4 tokens\x1b[K\n",
  );
  const silent = new BenchProgress(2, { write: null });
  silent.stage("loading", 5);
  silent.tick(5);
  silent.end(); // no writer: nothing to check but that it does not throw
});

Deno.test("bench: usage errors name the flag", async () => {
  await assert.rejects(() => runBench({ model: "x", shape: "tiny" }), /--model DIR or --shape/);
  await assert.rejects(() => runBench({ dtype: "bf16" }), /--dtype applies to --shape only/);
  await assert.rejects(() => runBench({ shape: "tiny", newTokens: 1 }), /--new-tokens/);
  await assert.rejects(() => runBench({ shape: "tiny", maxChunk: 0 }), /--max-chunk/);
  await assert.rejects(() => runBench({ shape: "tiny", sessions: -1 }), /--sessions/);
  await assert.rejects(() => runBench({ shape: "tiny", kvWarmMb: -1 }), /--kv-warm-mb/);
  await assert.rejects(() => runBench({ shape: "tiny", prefillRuns: 0 }), /--prefill-runs/);
  await assert.rejects(() => runBench({ shape: "tiny", readBytes: 0 }), /--read-mib/);
  await assert.rejects(() => runBench({ shape: "tiny", kvDtype: "f8" as "f16" }), /--kv-dtype/);
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
