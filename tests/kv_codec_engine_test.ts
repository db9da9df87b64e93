/**
 * Precision by recency end to end: an engine with each KV codec and a 16-token hot window,
 * generating and scoring, against a float64 reference of what it computes: the reference
 * forward's K and V, with every block that the engine has re-encoded by the time a query runs
 * passed through the codec's reference encoder and decoder (kernels/reference_kv.ts).
 *
 * When a block is re-encoded: after each readback round, the blocks wholly behind the newest
 * 16 tokens of what was read back (engine/kv/recency.ts). With one decode step per submission
 * (maxSteps 1) the step of query position q > P (P the prompt length) is encoded after the
 * round that read token q − 1, so it sees re-encoded the blocks ending at or before
 * q − 1 − 16; the prefill and the first step (q ≤ P) see none. Scoring re-encodes after each
 * 16-token chunk: a query in the chunk from c sees the blocks ending at or before c − 16.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { sampling } from "../api/types.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import {
  linear,
  logSoftmax,
  mlpInto,
  ReferenceModel,
  rmsnorm,
  rope,
  topMargin,
} from "../engine/model/reference_forward.ts";
import {
  decodeBlockRef,
  decodeHeadRef,
  encodeBlockRef,
  encodeHeadRef,
} from "../kernels/reference_kv.ts";
import { KvPool } from "../engine/kv/pool.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import type { ModelConfig } from "../engine/model/config.ts";
import type { KvCodec } from "../kernels/kv_codec.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { createApp } from "../routes/app.ts";
import { rng, testGpu } from "./util.ts";

const HOT = 16;
const MODEL: TestModelOptions = {
  arch: "llama",
  dtype: "f16",
  hidden: 128,
  heads: 4,
  kvHeads: 2,
  ffn: 192,
  layers: 2,
  seed: 5,
};

/**
 * Logits at every position of `tokens`, where query q reads the first `codecBlocks(q)` logical
 * blocks through `codec` (encoded from the f32-rounded K and V, as the engine's f32 cache holds
 * them) and the rest as they are.
 */
function codecForward(
  m: ReferenceModel,
  tokens: number[],
  codec: KvCodec,
  codecBlocks: (q: number) => number,
): Float64Array[] {
  const cfg = m.config, w = m.weights;
  const { hiddenSize: H, headDim: D, nHeads, nKvHeads: Hk } = cfg;
  const T = tokens.length, group = nHeads / Hk, full = Math.floor(T / 16);
  const x = tokens.map((t) => w.embed.slice(t * H, (t + 1) * H));
  for (const layer of w.layers) {
    const hn = x.map((r) => rmsnorm(r, layer.inputNorm, cfg.rmsEps));
    const q = hn.map((r) => linear(r, layer.q, { bias: layer.qBias }));
    const k = hn.map((r) => linear(r, layer.k, { bias: layer.kBias }).map(Math.fround));
    const v = hn.map((r) => linear(r, layer.v, { bias: layer.vBias }).map(Math.fround));
    for (let t = 0; t < T; t++) {
      rope(q[t], { nHeads, headDim: D, pos: t, invFreq: m.invFreq });
      rope(k[t], { nHeads: Hk, headDim: D, pos: t, invFreq: m.invFreq });
      k[t] = k[t].map(Math.fround);
    }
    // Each whole block's K and V as its codec block decodes: [block][position][Hk * D].
    const coded = (src: Float64Array[], isV: boolean) =>
      Array.from({ length: full }, (_, b) => {
        const out = Array.from({ length: 16 }, () => new Float64Array(Hk * D));
        for (let h = 0; h < Hk; h++) {
          const head = new Float64Array(16 * D);
          for (let t = 0; t < 16; t++) {
            head.set(src[16 * b + t].subarray(h * D, (h + 1) * D), t * D);
          }
          const back = decodeHeadRef(codec, isV, encodeHeadRef(codec, isV, head, D), D);
          for (let t = 0; t < 16; t++) out[t].set(back.subarray(t * D, (t + 1) * D), h * D);
        }
        return out;
      });
    const kc = coded(k, false), vc = coded(v, true);
    const attn = q.map((qt, i) => {
      const out = new Float64Array(nHeads * D), n = codecBlocks(i);
      const key = (j: number) => j < 16 * n ? kc[j >> 4][j % 16] : k[j];
      const val = (j: number) => j < 16 * n ? vc[j >> 4][j % 16] : v[j];
      for (let h = 0; h < nHeads; h++) {
        const qb = h * D, kb = Math.floor(h / group) * D, s = new Float64Array(i + 1);
        for (let j = 0; j <= i; j++) {
          for (let d = 0; d < D; d++) s[j] += qt[qb + d] * key(j)[kb + d];
          s[j] /= Math.sqrt(D);
        }
        const mx = Math.max(...s);
        let sum = 0;
        for (let j = 0; j <= i; j++) sum += s[j] = Math.exp(s[j] - mx);
        for (let j = 0; j <= i; j++) {
          for (let d = 0; d < D; d++) out[qb + d] += (s[j] / sum) * val(j)[kb + d];
        }
      }
      return out;
    });
    for (let t = 0; t < T; t++) {
      const o = linear(attn[t], layer.o, { bias: layer.oBias });
      for (let i = 0; i < H; i++) x[t][i] += o[i];
      mlpInto(x[t], layer, cfg.rmsEps);
    }
  }
  return x.map((r) => linear(rmsnorm(r, w.norm, cfg.rmsEps), w.lmHead));
}

/**
 * Largest |Δ logprob| allowed, by codec. The engine's K and V are f32 GPU arithmetic, the
 * reference's float64 rounded to f32: they differ in the last bits, so a value the reference
 * puts on one side of a rounding boundary the GPU may put on the other, and that element moves
 * by a quantization step: an f16 ulp, a 127th of an int8 row, up to 2^k of a bfp4 group, 2·a of
 * a sign1 row (a flipped sign). Measured on lavapipe: at most 1.2e-4 (none flipped enough to
 * show); the bounds leave room for a few flips on another adapter, and stay well below what the
 * codec itself moves (asserted: a run that ignored the codec blocks would fail).
 */
const TOLERANCE: Record<Exclude<KvCodec, "none">, number> = {
  f16: 2e-4,
  int8: 2e-3,
  bfp4: 1e-2,
  sign1: 2e-2,
};

for (const codec of ["f16", "int8", "bfp4", "sign1"] as const) {
  Deno.test(`engine with --kv-codec ${codec} --kv-hot ${HOT} matches its float64 reference`, async () => {
    await testGpu();
    await withTestModel(MODEL, async (dir) => {
      const engine = await Engine.load(dir, {
        maxSlots: 1,
        contextLength: 128,
        maxChunk: 32,
        maxSteps: 1,
        kvCodec: codec,
        kvHot: HOT,
      });
      const ref = await ReferenceModel.load(await loadModelFolder(dir));
      const r = rng(23), P = 37, N = 40;
      const prompt = Array.from({ length: P }, () => 3 + r.int(300));
      const gen = engine.generate({
        promptIds: prompt,
        sampling: sampling({ maxTokens: N, stopAtEos: false }),
      });
      const tokens: number[] = [], logprobs: number[] = [];
      for await (const t of gen) {
        tokens.push(t.id);
        logprobs.push(t.logprob);
      }
      assert.equal(tokens.length, N);
      const seq = [...prompt, ...tokens];
      const aged = (end: number) => Math.max(0, Math.floor((end - HOT) / 16));
      const want = codecForward(ref, seq, codec, (q) => q <= P ? 0 : aged(q - 1));
      const plain = codecForward(ref, seq, codec, () => 0);
      let worst = 0, apart = 0, decisive = 0;
      for (let i = 0; i < N; i++) {
        const row = want[P - 1 + i], lp = logSoftmax(row);
        if (topMargin(row) > 0.05) {
          assert.equal(tokens[i], lp.indexOf(Math.max(...lp)), `step ${i}`);
          decisive++;
        }
        worst = Math.max(worst, Math.abs(logprobs[i] - lp[tokens[i]]));
        apart = Math.max(apart, Math.abs(lp[tokens[i]] - logSoftmax(plain[P - 1 + i])[tokens[i]]));
      }
      // Scoring: teacher-forced, re-encoded after every 16-token chunk.
      const scored = Array.from({ length: 80 }, () => 3 + r.int(300));
      const got = await engine.score(scored);
      const sw = codecForward(ref, scored, codec, (q) => aged(16 * Math.floor(q / 16)));
      let worstScore = 0;
      for (let i = 0; i < got.length; i++) {
        worstScore = Math.max(worstScore, Math.abs(got[i] - logSoftmax(sw[i])[scored[i + 1]]));
      }
      console.log(
        `${codec}: generation max |Δ logprob| ${worst.toExponential(2)} (${decisive}/${N} ` +
          `argmax checks), scoring ${worstScore.toExponential(2)}; the codec itself moves ` +
          `logprobs by up to ${apart.toExponential(2)}`,
      );
      assert.ok(worst <= TOLERANCE[codec], `generation: |Δ logprob| ${worst}`);
      assert.ok(worstScore <= TOLERANCE[codec], `scoring: |Δ logprob| ${worstScore}`);
      assert.ok(decisive >= N / 2, `too few decisive steps (${decisive})`);
      assert.ok(apart > 4 * TOLERANCE[codec], `the codec moves logprobs by only ${apart}`);
      const kv = engine.kvStats();
      assert.equal(kv.codec, codec);
      assert.equal(kv.codecBlocks.used, 0, "codec blocks left behind");
      assert.ok(kv.capacity.tokens > kv.gpu.total * 16);
    });
  });
}

Deno.test("--kv-codec: refusals, the pool's capacity and /health", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const refuse = (o: Parameters<typeof Engine.load>[1], re: RegExp) =>
      assert.rejects(Engine.load(dir, { maxSlots: 1, contextLength: 64, ...o }), re);
    await refuse({ kvCodec: "int4" as KvCodec }, /--kv-codec must be one of none, f16, int8/);
    await refuse({ kvHot: 32 }, /--kv-hot applies with --kv-codec/);
    await refuse({ kvCodec: "int8", kvHot: -1 }, /--kv-hot must be an integer >= 0/);
    await refuse({ kvCodec: "f16", kvDtype: "f16" }, /--kv-codec f16 re-encodes an f32 cache/);
    const plain = await Engine.load(dir, { maxSlots: 1, contextLength: 64, kvBlocks: 40 });
    const engine = await Engine.load(dir, {
      maxSlots: 1,
      contextLength: 64,
      kvBlocks: 40,
      kvCodec: "bfp4",
    });
    const none = plain.kvStats(), kv = engine.kvStats();
    assert.deepEqual([none.codec, none.hotTokens, none.codecBlocks.total], ["none", 0, 0]);
    assert.equal(none.capacity.tokens, 39 * 16);
    // --kv-blocks counts hot blocks; the codec blocks take as many bytes again: 64/9 as many
    // at head dim 32 (bfp4: 4.5 bits a value against f32's 32).
    assert.equal(kv.gpu.total, 39);
    assert.equal(kv.codecBlocks.total, Math.floor((40 * 32 * 4) / 18));
    assert.equal(kv.hotTokens, 128);
    assert.ok(kv.capacity.tokensPerGb > 3.5 * none.capacity.tokensPerGb);
    const h = await (await createApp(engine, {}).request("/health")).json();
    assert.equal(h.kv.codec, "bfp4");
    assert.equal(h.kv.hot_tokens, 128);
    assert.deepEqual(h.kv.codec_blocks, { used: 0, total: kv.codecBlocks.total });
    assert.equal(h.kv.capacity_tokens, kv.capacity.tokens);
    assert.equal(h.kv.tokens_per_gb, Math.round(kv.capacity.tokensPerGb));
  });
});

Deno.test("KvPool with codec blocks: encode, copyOut in hot and raw form, write of either", async () => {
  const gpu = await testGpu();
  const cfg = { nLayers: 3, nKvHeads: 1, headDim: 40 } as ModelConfig;
  const pool = new KvPool(gpu, cfg, { numBlocks: 4, dtype: "f32", codec: "int8", codecBlocks: 3 });
  const heads = 3, elems = heads * 16 * 40, r = rng(4);
  assert.deepEqual([pool.blockBytesOf(3), pool.blockBytesOf(4)], [elems * 4, heads * 176 * 4]);
  const hot = Array.from({ length: 2 }, () => ({ k: r.uniform(elems, 3), v: r.uniform(elems) }));
  const bytes = (k: ArrayLike<number>, v: ArrayLike<number>) =>
    new Uint8Array(Float32Array.from([...Array.from(k), ...Array.from(v)]).buffer);
  hot.forEach((b, i) => pool.write(1 + i, bytes(b.k, b.v)));
  pool.encode([[1, 5], [2, 4]]);
  const read = async (ids: number[], raw: boolean) => {
    const staging = pool.copyOut(ids, { raw });
    await staging.mapAsync(GPUMapMode.READ);
    const out = new Uint8Array(staging.getMappedRange().slice(0));
    staging.destroy();
    return out;
  };
  const shape = { heads, headDim: 40 };
  const want = hot.map((b) => ({
    k: encodeBlockRef("int8", false, Float32Array.from(b.k), shape),
    v: encodeBlockRef("int8", true, Float32Array.from(b.v), shape),
  }));
  // Raw: each block as held (codec words, then a hot block's f32), back to back.
  const raw = await read([5, 3, 4], true);
  const cb = pool.codecBytes, hb = pool.blockBytes;
  assert.equal(raw.byteLength, 2 * cb + 2 * hb + 2 * cb);
  assert.deepEqual(
    new Uint32Array(raw.slice(0, 2 * cb).buffer),
    Uint32Array.from([...want[0].k, ...want[0].v]),
  );
  assert.deepEqual(
    new Uint32Array(raw.slice(-2 * cb).buffer),
    Uint32Array.from([...want[1].k, ...want[1].v]),
  );
  // Hot form: the codec blocks decoded on the GPU, a hot block as it is.
  const hotForm = new Float32Array((await read([4, 1], false)).buffer);
  const decoded = [
    ...decodeBlockRef("int8", false, want[1].k, shape),
    ...decodeBlockRef("int8", true, want[1].v, shape),
  ];
  assert.deepEqual(Array.from(hotForm.subarray(0, 2 * elems)), decoded.map(Math.fround));
  assert.deepEqual(hotForm.subarray(2 * elems), Float32Array.from([...hot[0].k, ...hot[0].v]));
  // A codec block written raw reads back the same.
  pool.write(6, raw.slice(0, 2 * cb));
  assert.deepEqual(await read([6], true), raw.slice(0, 2 * cb));
  assert.throws(() => pool.write(6, raw.slice(0, 2 * hb)), /KV block 6 is/);
  assert.throws(() => pool.encode([[4, 5]]), /re-encoding block 4 into 5/);
});

Deno.test("perplexity --kv-codec: the blocks behind the hot window are what later chunks read", async () => {
  await testGpu();
  const script = new URL("../scripts/perplexity.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, "--kv-codec", "sign1", "--kv-hot", "16", "--context", "64"]
      .concat(["--max-tokens", "128", "--json"]),
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const got = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
  // Two windows of 64 tokens, scored 16 at a time: after the chunks ending at 32, 48 and 64 the
  // blocks ending 16 tokens before move, 3 per window.
  assert.deepEqual(
    [got.tokens, got.kv_codec, got.kv_hot, got.kv_reencoded, got.context],
    [126, "sign1", 16, 6, 64],
  );
  assert.ok(Number.isFinite(got.ppl) && got.ppl > 1);
});

Deno.test("--kv-codec: the default pool leaves the codec blocks half the binding", async () => {
  const gpu = await testGpu();
  const dir = new URL("../models/strata-default", import.meta.url).pathname;
  const engine = await Engine.load(dir, { maxSlots: 1, kvCodec: "int8" });
  const kv = engine.kvStats(), c = engine.config;
  const blockBytes = c.nLayers * c.nKvHeads * 16 * c.headDim * 4;
  const hot = kv.gpu.total + 1, perBinding = Math.floor(gpu.maxBinding / blockBytes);
  assert.equal(hot, Math.min(2048, Math.floor(perBinding / 2)));
  // int8 at head dim 64: 1088 bytes a head block against 4096.
  assert.equal(kv.codecBlocks.total, Math.floor((hot * 4096) / 1088));
  await assert.rejects(
    Engine.load(dir, { maxSlots: 1, kvCodec: "int8", kvBlocks: perBinding }),
    /--kv-codec int8: \d+ hot blocks leave room in one binding for 0 codec blocks/,
  );
});

Deno.test("a session's codec blocks snapshot in the hot form and come back in another engine", async () => {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-kv-codec-" });
  try {
    await withTestModel(MODEL, async (model) => {
      const path = `${dir}/s.sqlite3`, opts = { maxSlots: 1, contextLength: 128, maxSteps: 1 };
      const turn = async (e: Engine, promptIds: number[], n: number) => {
        const gen = e.generate({
          promptIds,
          sampling: sampling({ maxTokens: n, stopAtEos: false }),
          sessionId: "s",
        });
        const tokens: number[] = [], logprobs: number[] = [];
        for await (const t of gen) {
          tokens.push(t.id);
          logprobs.push(t.logprob);
        }
        return { tokens, logprobs, cached: (await gen.result).cachedTokens };
      };
      const prompt = Array.from({ length: 45 }, (_, i) => 3 + ((i * 37) % 300));
      let store = await SessionStore.open(path);
      const a = await Engine.load(model, { ...opts, store, kvCodec: "int8", kvHot: HOT });
      const first = await turn(a, prompt, 24);
      // Idle, the session (68 tokens computed) keeps its newest 16 hot: blocks 0-2 are int8.
      assert.equal(a.kvStats().codecBlocks.used, 3);
      await a.flushSnapshots();
      store.close();
      store = await SessionStore.open(path);
      const b = await Engine.load(model, { ...opts, store, kvCodec: "int8", kvHot: HOT });
      assert.equal(b.session("s")?.tokens, 68);
      // The next turn on both: B holds the decoded values in hot blocks, A the int8 blocks that
      // decode to them, so they attend the same keys and values.
      const next = [...prompt, ...first.tokens, 7, 8, 9];
      const [x, y] = [await turn(a, next, 12), await turn(b, next, 12)];
      assert.deepEqual([x.cached, y.cached], [68, 68]);
      assert.deepEqual(y.tokens, x.tokens);
      const worst = Math.max(...x.logprobs.map((l, i) => Math.abs(l - y.logprobs[i])));
      assert.ok(worst < 1e-4, `restored session: |Δ logprob| ${worst}`);
      await b.flushSnapshots();
      store.close();
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
