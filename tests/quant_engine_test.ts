/**
 * The engine on quantized weights, end to end. `--quantize int8|e4m3`: the logprobs of prefill
 * (scored: int8 runs int8 x int8 there) and of generation (decode: W dequantized in registers)
 * against the float64 reference of the weights the GPU quantized (read back). GGUF Q8_0 and
 * Q4_K_M files (scripts/write_gguf.ts) against their dequantized float64 reference. The precision
 * monitor: a layer forced out of range (its MLP norm weights shrunk, so its gate/up input's std is
 * under 0.01) switches to its 16-bit weights and the engine then agrees with a reference that
 * runs that layer unquantized; with the fallback dropped it stays quantized and says so.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import {
  type ForwardOptions,
  logSoftmax,
  ReferenceModel,
} from "../engine/model/reference_forward.ts";
import { readTensor, type TensorData, writeSafetensors } from "../engine/model/safetensors.ts";
import { PROJECTIONS } from "../engine/model/weights.ts";
import { readBuffer } from "../gpu/device.ts";
import { decode, isFloatFormat } from "../gpu/dtype.ts";
import { quantActRef, quantWeightRef } from "../kernels/reference.ts";
import { quantUnitsRef } from "../kernels/reference_quant.ts";
import { hasDot4 } from "../kernels/matmul_q8.ts";
import type { WeightBuffer } from "../kernels/weight.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { writeGguf } from "../scripts/write_gguf.ts";
import { createApp } from "../routes/app.ts";
import { runBench } from "../scripts/bench.ts";
import { parseFlags } from "../scripts/bench_options.ts";
import { formatTable } from "../scripts/bench_report.ts";
import { rng, testGpu } from "./util.ts";

/** The float64 values of a weight as it is on the GPU. */
async function gpuValues(w: WeightBuffer): Promise<Float64Array> {
  const gpu = await testGpu();
  if (w.parts) {
    const parts = await Promise.all(w.parts.map((p) => gpuValues(p.w)));
    const out = new Float64Array(w.rows * w.cols);
    let o = 0;
    for (const p of parts) out.set(p, (o += p.length) - p.length);
    return out;
  }
  if (isFloatFormat(w.dtype)) {
    const bytes = w.rows * w.cols * (w.dtype === "f32" ? 4 : 2);
    return decode(new Uint8Array(await readBuffer(gpu, w.buffer, bytes)), w.dtype, w.rows * w.cols);
  }
  const codes = new Uint32Array(await readBuffer(gpu, w.buffer));
  const scales = new Uint32Array(await readBuffer(gpu, w.scales!));
  return quantWeightRef({ codes, scales }, w.dtype, w.rows, w.cols);
}

/** The reference model with every layer's projections as `engine` runs them now. */
async function asRun(engine: Engine, base: ReferenceModel): Promise<ReferenceModel> {
  const cfg = engine.config, { headDim: D, nHeads, nKvHeads, hiddenSize: H } = cfg;
  const mon = engine.runner.monitor;
  const layers = await Promise.all(base.weights.layers.map(async (layer, l) => {
    const [qkv, o, gateUp, down] = await Promise.all(
      PROJECTIONS.map((p) => gpuValues(mon.weight(l, p))),
    );
    const q = nHeads * D * H, kv = nKvHeads * D * H, F = cfg.intermediateSize;
    const gate = new Float64Array(F * H), up = new Float64Array(F * H);
    for (let i = 0; i < F; i++) {
      gate.set(gateUp.subarray(2 * i * H, (2 * i + 1) * H), i * H);
      up.set(gateUp.subarray((2 * i + 1) * H, (2 * i + 2) * H), i * H);
    }
    return {
      ...layer,
      q: qkv.slice(0, q),
      k: qkv.slice(q, q + kv),
      v: qkv.slice(q + kv),
      o,
      gate,
      up,
      down,
    };
  }));
  return new ReferenceModel(base.config, { ...base.weights, layers });
}

/**
 * The reference's projections' inputs rounded as the int8 paths round them at position t of
 * layer l: `row` per row (`q8`: more than 16 rows against int8 W), `unit` per 16 k (`small`'s xq:
 * up to 16 rows), `none` not at all.
 */
function int8Inputs(
  rounding: (t: number, l: number) => "row" | "unit" | "none",
): ForwardOptions {
  return {
    projectionInput: (x, t, l) => {
      const r = rounding(t, l);
      if (r === "row") return quantActRef(x, 1, x.length).values;
      return r === "unit" ? quantUnitsRef(x, 1, x.length).values : x;
    },
  };
}

/** Largest |Δ| between the engine's scores of `ids` and the reference's. */
async function scoreDelta(
  engine: Engine,
  ref: ReferenceModel,
  ids: number[],
  opts: ForwardOptions = {},
): Promise<number> {
  const got = await engine.score(ids);
  const logits = ref.forward(ids, opts);
  let worst = 0;
  for (let i = 0; i + 1 < ids.length; i++) {
    worst = Math.max(worst, Math.abs(got[i] - logSoftmax(logits[i])[ids[i + 1]]));
  }
  return worst;
}

/** Greedy generation's logprobs against the reference's, teacher-forced on the same tokens. */
async function generateDelta(
  engine: Engine,
  ref: ReferenceModel,
  prompt: number[],
  opts: ForwardOptions = {},
) {
  const gen = engine.generate({
    promptIds: prompt,
    sampling: sampling({ maxTokens: 10, stopAtEos: false }),
  });
  const tokens: number[] = [], lps: number[] = [];
  for await (const t of gen) {
    tokens.push(t.id);
    lps.push(t.logprob);
  }
  await gen.result;
  const logits = ref.forward([...prompt, ...tokens], opts);
  let worst = 0;
  tokens.forEach((t, i) => {
    worst = Math.max(worst, Math.abs(lps[i] - logSoftmax(logits[prompt.length - 1 + i])[t]));
  });
  return worst;
}

const OPTS = { maxSlots: 2, contextLength: 96, maxChunk: 64 };

for (const quantize of ["int8", "e4m3"] as const) {
  Deno.test(`--quantize ${quantize}: prefill and decode logprobs against the float64 reference of the quantized weights`, async () => {
    await testGpu();
    const model = { dtype: "f16" as const, hidden: 64, heads: 4, kvHeads: 2, layers: 2, seed: 41 };
    await withTestModel(model, async (dir) => {
      const engine = await Engine.load(dir, { ...OPTS, quantize });
      assert.equal(engine.weights.quant.mode, quantize);
      assert.deepEqual(engine.weights.quant.formats, [quantize]);
      for (let l = 0; l < 2; l++) {
        for (const p of PROJECTIONS) {
          assert.equal(engine.runner.monitor.weight(l, p).dtype, quantize);
        }
      }
      const ref = await asRun(engine, await ReferenceModel.load(await loadModelFolder(dir)));
      const r = rng(5);
      const ids = Array.from({ length: 40 }, () => r.int(ref.config.vocabSize));
      // int8 runs 40 rows (scored) and a 20-token prompt through the q8 path, which quantizes
      // x per row; decode's single rows go through small, which quantizes x per 16 k where the
      // adapter has dot4I8Packed (lavapipe and GL do).
      const int8 = quantize === "int8";
      const decoded = int8 && hasDot4() ? "unit" : "none";
      const scored = await scoreDelta(engine, ref, ids, int8Inputs(() => int8 ? "row" : "none"));
      const generated = await generateDelta(
        engine,
        ref,
        ids.slice(0, 20),
        int8Inputs((t) => !int8 ? "none" : t < 20 ? "row" : decoded),
      );
      // What quantizing x costs, against the reference of the quantized weights alone.
      const weightsOnly = await scoreDelta(engine, ref, ids);
      const decodeAsIs = await generateDelta(
        engine,
        ref,
        ids.slice(0, 20),
        int8Inputs((t) => !int8 ? "none" : t < 20 ? "row" : "none"),
      );
      console.log(
        `${quantize}: max |Δ logprob| scored ${scored}, generated ${generated}; ` +
          `x multiplied unquantized in the reference: scored ${weightsOnly}, decode ${decodeAsIs}`,
      );
      // int8's bound leaves room for an x code the GPU rounded the other way at a near-tie.
      const bound = int8 ? 0.05 : 1e-3;
      assert.ok(scored <= bound, `scored: ${scored}`);
      assert.ok(generated <= bound, `generated: ${generated}`);
      const stats = engine.precisionStats();
      assert.ok(stats.observations >= 1, "the monitor saw the batches");
      assert.ok(stats.layers.every((l) => !l.fellBack && l.bits === 8), JSON.stringify(stats));
    });
  });
}

Deno.test("GGUF Q8_0 and Q4_K_M (llama; qwen2 with biases) run quantized and agree with their dequantized reference", async () => {
  await testGpu();
  const llama = { dtype: "f16" as const, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, seed: 43 };
  // Qwen2's q, k, v biases; Q4_K_M makes layer 1's v Q6_K beside Q4_K q and k: QKV in parts,
  // each with its bias.
  const qwen2 = { ...llama, arch: "qwen2" as const, seed: 46 };
  for (const [model, types] of [[llama, ["q8_0", "q4_k_m"]], [qwen2, ["q4_k_m"]]] as const) {
    await withTestModel(model, (dir) => checkGguf(dir, types));
  }
});

async function checkGguf(dir: string, types: readonly ("q8_0" | "q4_k_m")[]): Promise<void> {
  {
    for (const type of types) {
      const file = join(dir, `m-${type}.gguf`);
      await writeGguf(dir, file, { type });
      const engine = await Engine.load(file, OPTS);
      const q = engine.weights.quant;
      assert.equal(q.mode, "gguf");
      assert.equal(q.fallback, false);
      assert.deepEqual(q.formats.sort(), type === "q8_0" ? ["q8_0"] : ["q4_k", "q6_k"]);
      const ref = await ReferenceModel.load(await loadModelFolder(file));
      // The GPU holds exactly the file's values.
      assert.deepEqual(await asRun(engine, ref).then((m) => m.weights.layers), ref.weights.layers);
      const r = rng(7);
      const ids = Array.from({ length: 33 }, () => r.int(ref.config.vocabSize));
      const scored = await scoreDelta(engine, ref, ids);
      const generated = await generateDelta(engine, ref, ids.slice(0, 9));
      console.log(`${type}: max |Δ logprob| scored ${scored}, generated ${generated}`);
      assert.ok(scored <= 2e-3 && generated <= 2e-3, `${scored} / ${generated}`);
      if (type === "q4_k_m") {
        // llama-quantize's use_more_bits picks the last layer of two.
        const parts = engine.runner.monitor.weight(1, "qkv").parts;
        assert.deepEqual(parts?.map((p) => p.w.dtype), ["q4_k", "q6_k"], "layer 1's QKV parts");
        assert.equal(parts!.every((p) => p.bias), engine.config.attentionBias);
      }
    }
  }
}

/** Rewrites the test model in `dir` with layer `layer`'s MLP norm weights times `factor`. */
async function shrinkNorm(dir: string, layer: number, factor: number): Promise<void> {
  const folder = await loadModelFolder(dir);
  const tensors: TensorData[] = [];
  for (const t of folder.tensors.values()) {
    let data = await readTensor(t);
    if (t.name === `model.layers.${layer}.post_attention_layernorm.weight`) {
      const v = new Float16Array(data.slice().buffer).map((x) => x * factor);
      data = new Uint8Array(v.buffer);
    }
    tensors.push({ name: t.name, dtype: t.dtype, shape: t.shape, data });
  }
  await writeSafetensors(join(dir, "model.safetensors"), tensors);
}

Deno.test("precision monitor: a layer forced out of range runs its 16-bit weights; without them it is reported", async () => {
  await testGpu();
  const model = { dtype: "f16" as const, hidden: 64, heads: 4, kvHeads: 2, layers: 3, seed: 44 };
  await withTestModel(model, async (dir) => {
    await shrinkNorm(dir, 1, 1e-4);
    const prompt = Array.from({ length: 24 }, (_, i) => (i * 37) % 200 + 3);
    const engine = await Engine.load(dir, { ...OPTS, quantize: "int8" });
    // The first request's prefill is measured; its readback switches layer 1.
    const first = engine.generate({ promptIds: prompt, sampling: sampling({ maxTokens: 2 }) });
    for await (const _ of first) { /* drain */ }
    const stats = engine.precisionStats();
    console.log(JSON.stringify(stats.layers));
    assert.deepEqual(stats.layers.map((l) => l.fellBack), [false, true, false]);
    assert.match(stats.layers[1].reason!, /gateUp input std [\d.e-]+ < 0\.01/);
    assert.equal(stats.layers[1].format, "f16");
    assert.equal(stats.layers[1].bits, 16);
    assert.equal(stats.fallbacks, 1);
    const labels = engine.profileDecodeStep(1, 8).map((d) => d.label);
    assert.ok(labels.some((l) => /matmul small 1x128x64 f16 \+norm swiglu/.test(l)), labels.join());
    assert.equal(labels.filter((l) => / int8/.test(l) && /swiglu/.test(l)).length, 2);
    // Generated after the switch: the reference with layer 1 at 16 bits, the others quantized.
    const ref = await asRun(engine, await ReferenceModel.load(await loadModelFolder(dir)));
    // An 11-token prompt and single decode rows: all through small (layer 1 at 16 bits: x as is).
    const delta = await generateDelta(
      engine,
      ref,
      prompt.slice(0, 11),
      int8Inputs((_, l) => (hasDot4() && l !== 1 ? "unit" : "none")),
    );
    assert.ok(delta <= 0.05, `|Δ logprob| ${delta}`);
    // What the server says of it.
    const app = createApp(engine, {});
    const health = await (await app.request("/health")).json();
    assert.deepEqual(health.precision, {
      mode: "int8",
      fallback: true,
      layers: 3,
      layers_16bit: 1,
      fallbacks: 1,
    });
    const metrics = await (await app.request("/metrics")).text();
    assert.match(metrics, /\nstrata_layer_weight_bits\{layer="0",format="int8"\} 8\n/);
    assert.match(metrics, /\nstrata_layer_weight_bits\{layer="1",format="f16"\} 16\n/);
    assert.match(metrics, /\nstrata_precision_fallbacks_total\{direction="to_16bit"\} 1\n/);
    assert.match(metrics, /\nstrata_layer_out_of_range_total\{layer="1"\} [1-9]/);

    // Without the 16-bit copies the layer stays quantized; the policy counts it.
    const lean = await Engine.load(dir, { ...OPTS, quantize: "int8", fallback: false });
    const gen = lean.generate({ promptIds: prompt, sampling: sampling({ maxTokens: 2 }) });
    for await (const _ of gen) { /* drain */ }
    const s = lean.precisionStats();
    assert.equal(s.fallback, false);
    assert.deepEqual(s.layers.map((l) => l.fellBack), [false, false, false]);
    assert.ok(s.layers[1].outOfRange >= 1 && s.layers[0].outOfRange === 0, JSON.stringify(s));
    assert.equal(lean.runner.monitor.weight(1, "gateUp").dtype, "int8");
    const leanHealth = await (await createApp(lean, {}).request("/health")).json();
    assert.equal(leanHealth.precision.fallback, false);
    assert.match(
      leanHealth.precision.fallback_off,
      /--quantize-fallback off\): layers out of range stay quantized/,
    );
  });
});

Deno.test("--quantize refuses a file whose weights are already quantized, naming the flag", async () => {
  await testGpu();
  await withTestModel({ seed: 45 }, async (dir) => {
    const file = join(dir, "m.gguf");
    await writeGguf(dir, file, { type: "q8_0" });
    await assert.rejects(
      Engine.load(file, { ...OPTS, quantize: "int8" }),
      /--quantize int8 quantizes F32, F16 and BF16 weights; .*m\.gguf holds Q8_0 ones .*: leave --quantize off/,
    );
  });
});

Deno.test("CLI: generate, perplexity and bench take --quantize; bad values are refused naming the flag", async () => {
  const root = new URL("..", import.meta.url).pathname;
  const deno = async (...args: string[]) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", ...args],
      cwd: root,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const dec = new TextDecoder();
    return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
  };
  const gen = await deno(
    "main.ts",
    "generate",
    "--prompt",
    "Once upon a time",
    "--max-tokens",
    "6",
    "--quantize",
    "int8",
    "--json",
  );
  assert.equal(gen.code, 0, gen.stderr);
  assert.equal(JSON.parse(gen.stdout.trim().split("\n").at(-1)!).tokens.length, 6);
  const bad: [string[], RegExp][] = [
    [
      ["main.ts", "generate", "--prompt", "x", "--quantize", "int4"],
      /--quantize must be int8, e4m3 or none; got 'int4'/,
    ],
    [
      ["main.ts", "generate", "--prompt", "x", "--quantize", "e4m3", "--quantize-fallback", "no"],
      /--quantize-fallback must be on or off; got 'no'/,
    ],
    [
      ["main.ts", "serve", "--quantize-fallback", "off"],
      /--quantize-fallback applies with --quantize int8 or e4m3/,
    ],
    [
      ["scripts/perplexity.ts", "--quantize", "fp8"],
      /--quantize must be int8, e4m3 or none; got 'fp8'/,
    ],
    [["scripts/bench.ts", "--quantize", "q4"], /--quantize must be int8, e4m3 or none; got 'q4'/],
  ];
  for (const [args, want] of bad) {
    const r = await deno(...args);
    assert.equal(r.code, 1, args.join(" "));
    assert.match(r.stderr, want);
  }
  const json = await deno(
    "scripts/perplexity.ts",
    "--quantize",
    "e4m3",
    "--max-tokens",
    "64",
    "--json",
  );
  assert.equal(json.code, 0, json.stderr);
  const line = JSON.parse(json.stdout.trim().split("\n").at(-1)!);
  assert.equal(line.quantize, "e4m3");
  assert.ok(line.ppl > 1 && line.tokens === 63, JSON.stringify(line));
});

Deno.test("bench --quantize int8 --quantize-fallback off: every layer quantized, and the table says so", async () => {
  const gpu = await testGpu();
  const run = (quantizeFallback?: boolean) =>
    runBench({
      shape: "tiny",
      quantize: "int8",
      quantizeFallback,
      batch: [1],
      promptLen: 8,
      newTokens: 4,
      readBytes: 2 ** 20,
      prefillRuns: 1,
      gpu,
    });
  const off = await run(false);
  assert.equal(off.quantize_fallback, false);
  assert.equal(off.layers_16bit, 0);
  assert.match(formatTable(off), /projections int8, fallback off: every layer at 8 bits; \d+ out/);
  const on = await run();
  assert.equal(on.quantize_fallback, true);
  assert.match(formatTable(on), /projections int8, \d+ layers at 16 bits by the monitor/);
  await assert.rejects(
    () => runBench({ shape: "tiny", quantizeFallback: false }),
    /--quantize-fallback applies with --quantize int8 or e4m3/,
  );
  assert.throws(
    () => parseFlags(["--quantize", "int8", "--quantize-fallback", "no"]),
    /--quantize-fallback must be on or off; got 'no'/,
  );
});
