/**
 * Constrained decoding's kernels against their float64 references: the sampler with grammar masks
 * (kernels/grammar_mask.wgsl) picks engine/grammar/sample_ref.ts sampleGrammarRef's token in
 * every row, masked and unmasked rows in one batch, several table images packed at awkward
 * offsets, budgets from loose to tight, plain and verification rows; apply_bias adds logit_bias
 * exactly; grammar_advance walks each slot's state as advanceRef does, up to the ring's NO_TOKEN.
 * A random byte-level vocabulary of about 900 pieces (tests/grammar_walk.ts).
 */
import assert from "node:assert/strict";
import { createStorage, readU32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import { philoxUniform } from "../gpu/philox.ts";
import { compileGrammar } from "../engine/grammar/grammar.ts";
import { advanceRef, maskRef, sampleGrammarRef } from "../engine/grammar/sample_ref.ts";
import { tokenBytesImage, vocabularyOf } from "../engine/grammar/vocab.ts";
import {
  advanceDispatch,
  applyBiasRef,
  biasDispatch,
  MAX_LOGIT_BIAS,
  packBias,
} from "../kernels/constraint.ts";
import { sampleDistRef, sampleRef } from "../kernels/reference.ts";
import {
  NO_GRAMMAR,
  packSampleParams,
  SAMPLE_PARAMS_BYTES,
  sampleDispatch,
  type SamplerSettings,
} from "../kernels/sample.ts";
import { NO_TOKEN } from "../kernels/step.ts";
import { randomToken, randomTokenizer, randomWalk } from "./grammar_walk.ts";
import { CASES } from "./grammar_schemas.ts";
import { type Rng, rng, testGpu } from "./util.ts";

const t = randomTokenizer(71, 900);
const vocab = vocabularyOf(t.tokenizerJson, t.tokenizer, { size: t.modelVocab });
const tokenImage = tokenBytesImage(vocab);
const V = vocab.size;
const images = [CASES[0], CASES[3], CASES[6]].map((c) => compileGrammar(vocab, c.spec).image);

/** The images packed into one buffer, each at a word offset that is not a round number. */
function packImages(): { words: Uint32Array; base: number[] } {
  const base: number[] = [];
  let at = 37;
  for (const img of images) {
    base.push(at);
    at += img.length + 13;
  }
  const words = new Uint32Array(at).fill(0xdeadbeef);
  images.forEach((img, i) => words.set(img, base[i]));
  return { words, base };
}

function settings(r: Rng): SamplerSettings & { seed: bigint } {
  return {
    temperature: [0, 0.5, 0.8, 1.5][r.int(4)],
    topK: [0, 1, 5, 50][r.int(4)],
    topP: [1, 0.9, 0.5][r.int(3)],
    minP: [0, 0.05][r.int(2)],
    repetitionPenalty: [1, 1.3][r.int(2)],
    presencePenalty: [0, 0.5][r.int(2)],
    frequencyPenalty: [0, 0.2][r.int(2)],
    seed: BigInt(r.int(2 ** 31)) * 0x1_0000_0001n,
  };
}

/** Logits on a coarse grid (many ties) and a few large ones, as f32. */
function logitsRow(r: Rng): Float32Array {
  const l = Float32Array.from({ length: V }, () => Math.round(r.next() * 40) / 4 - 5);
  for (let k = 0; k < 3; k++) l[r.int(V)] = 30;
  return l;
}

interface Row {
  image?: number; // index into images; undefined: unconstrained
  state: number;
  remaining: number;
}

for (const R of [1, 3]) {
  Deno.test(`masked sampling${R > 1 ? `, verification rows (R ${R})` : ""}: sampleGrammarRef's token in every row`, async () => {
    const gpu = await testGpu();
    const r = rng(900 + R);
    const seqs = R > 1 ? 12 : 40, rows = seqs * R;
    const { words, base } = packImages();
    const seq: Row[] = [];
    for (let s = 0; s < seqs; s++) {
      if (s % 5 === 4) {
        seq.push({ state: 0, remaining: 1 + r.int(50) });
        continue;
      }
      const image = s % 3;
      const w = randomWalk(images[image], tokenImage, vocab.eosIds, {
        budget: 1 + r.int(30),
        hurry: 0.3,
        rng: r,
      });
      // budgets from tight (at the state's distance to acceptance or one above) to loose
      const dist = images[image][images[image][10] + 4 * w.state + 2];
      const remaining = [dist, dist + 1, dist + 3, 10_000][r.int(4)] + R - 1;
      seq.push({ image, state: w.state, remaining: Math.max(R, remaining) });
    }
    const sets = seq.map(() => settings(r));
    const params = new Uint8Array(seqs * SAMPLE_PARAMS_BYTES);
    seq.forEach((q, s) => {
      const g = q.image === undefined ? NO_GRAMMAR : base[q.image];
      params.set(new Uint8Array(packSampleParams({ ...sets[s], grammar: g })), s * 48);
    });
    const logits = new Float32Array(rows * V);
    for (let i = 0; i < rows; i++) logits.set(logitsRow(r), i * V);
    const counts = Uint32Array.from(
      { length: seqs * V },
      () => r.next() < 0.05 ? (r.int(3) | (1 << 31)) >>> 0 : 0,
    );
    const positions = Uint32Array.from({ length: rows }, () => r.int(100000));
    const slotState = new Uint32Array(4 * seqs);
    seq.forEach((q, s) => slotState.set([0, q.remaining, 1, 0], 4 * s));
    // verification rows: drafts that are not in the vocabulary's small ids' way (penalties count
    // them as generated, which the reference below books too)
    const rowTok = Uint32Array.from({ length: rows }, () => r.int(V));
    const bufs = {
      logits: createStorage(gpu, logits.byteLength, logits),
      params: createStorage(gpu, params.byteLength, params),
      position: createStorage(gpu, positions.byteLength, positions),
      counts: createStorage(gpu, counts.byteLength, counts),
      out: createStorage(gpu, rows * 8),
      rowTok: createStorage(gpu, rowTok.byteLength, rowTok),
      grammar: {
        tables: createStorage(gpu, words.byteLength, words),
        state: createStorage(gpu, seqs * 4, Uint32Array.from(seq, (q) => q.state)),
        slotState: createStorage(gpu, slotState.byteLength, slotState),
      },
    };
    await run(gpu, [sampleDispatch(gpu, bufs, { rows, vocab: V, rowsPerSeq: R, mask: true })]);
    const raw = await readU32(gpu, bufs.out, rows * 2);
    const lp = new Float32Array(raw.buffer);
    let checked = 0, masked = 0;
    for (let i = 0; i < rows; i++) {
      const s = (i / R) | 0, j = i % R, q = seq[s];
      const c = counts.slice(s * V, (s + 1) * V);
      for (let k = 1; k <= j; k++) {
        const tok = rowTok[s * R + k];
        c[tok] = (0x80000000 | ((c[tok] & 0x3fffffff) + 1)) >>> 0;
      }
      const row = Float64Array.from(logits.subarray(i * V, (i + 1) * V));
      const opts = { ...sets[s], position: positions[i], counts: c };
      const image = q.image === undefined ? undefined : images[q.image];
      const allowed = image && maskRef(image, q.state, q.remaining - j);
      const eff = allowed ? row.map((x, k) => allowed[k] ? x : -Infinity) : row;
      const u = philoxUniform(opts.seed, opts.position);
      if (opts.temperature > 0 && knifeEdge(sampleDistRef(eff, opts), u)) continue;
      checked++;
      const want = image
        ? sampleGrammarRef(row, image, q.state, { ...opts, remaining: q.remaining - j })
        : sampleRef(row, opts);
      const token = want.token;
      const what = `seq ${s} row ${j} ${image ? `image ${q.image} state ${q.state}` : "free"}`;
      assert.equal(raw[2 * i], token, what);
      if (image) {
        masked++;
        assert.equal(allowed![raw[2 * i]], 1, `${what}: a token the mask refuses`);
        assert(Math.abs(lp[2 * i + 1] - want.logprob) < 1e-4, `logprob ${what}`);
      }
    }
    console.log(`masked sampling R=${R}: ${checked}/${rows} rows checked (${masked} masked)`);
    assert(checked >= rows * 0.75 && masked >= rows * 0.4);
  });
}

function knifeEdge(p: Float64Array, u: number, eps = 2e-6): boolean {
  let cum = 0;
  for (const x of p) {
    if (x === 0) continue;
    cum += x;
    if (Math.abs(cum - u) < eps) return true;
  }
  return false;
}

Deno.test("apply_bias: each sequence's logit_bias added to its rows, nothing else touched", async () => {
  const gpu = await testGpu();
  const r = rng(31);
  const Vb = 1031, seqs = 7, R = 2, rows = seqs * R;
  const lists = Array.from({ length: seqs }, (_, s) => {
    const n = [0, 1, 5, 300, MAX_LOGIT_BIAS, 2, 17][s];
    const ids = [...Array(Vb).keys()].sort(() => r.next() - 0.5).slice(0, n);
    return ids.map((id) => [id, [-100, 100, 0.37, -3.1, 12.5][r.int(5)]] as [number, number]);
  });
  const logits = Float32Array.from({ length: rows * Vb }, () => r.next() * 8 - 4);
  const params = new Uint8Array(seqs * SAMPLE_PARAMS_BYTES);
  lists.forEach((l, s) => {
    const p = packSampleParams({ ...settings(r), nBias: l.length });
    params.set(new Uint8Array(p), s * 48);
  });
  const bias = new Uint32Array(seqs * MAX_LOGIT_BIAS * 2);
  lists.forEach((l, s) => bias.set(packBias(l), s * MAX_LOGIT_BIAS * 2));
  const bufs = {
    logits: createStorage(gpu, logits.byteLength, logits),
    params: createStorage(gpu, params.byteLength, params),
    bias: createStorage(gpu, bias.byteLength, bias),
  };
  // rows [1, rows - 1): the first and last rows stay as they were
  await run(gpu, [
    biasDispatch(gpu, bufs, { rowBegin: 1, rowEnd: rows - 1, vocab: Vb, rowsPerSeq: R }),
  ]);
  const got = new Float32Array((await readU32(gpu, bufs.logits, rows * Vb)).buffer);
  for (let i = 0; i < rows; i++) {
    const row = logits.subarray(i * Vb, (i + 1) * Vb);
    const inRange = i >= 1 && i < rows - 1;
    const want = inRange ? applyBiasRef(row, lists[(i / R) | 0]) : Float64Array.from(row);
    for (let k = 0; k < Vb; k++) {
      assert.equal(got[i * Vb + k], Math.fround(want[k]), `row ${i} token ${k}`);
    }
  }
});

Deno.test("grammar_advance: each constrained slot walks its tokens as advanceRef, up to NO_TOKEN", async () => {
  const gpu = await testGpu();
  const r = rng(77);
  const { words, base } = packImages();
  const S = 23, stride = 5, tokensPerSlot = 4, steps = 6;
  const which = Array.from({ length: S }, (_, s) => s % 4 === 3 ? undefined : s % 3);
  const params = new Uint8Array(S * SAMPLE_PARAMS_BYTES);
  which.forEach((w, s) => {
    const g = w === undefined ? NO_GRAMMAR : base[w];
    params.set(new Uint8Array(packSampleParams({ ...settings(r), grammar: g })), s * 48);
  });
  const state = new Uint32Array(S).fill(0);
  state[3] = 12345; // an unconstrained slot's word is left as it is
  const want = Uint32Array.from(state);
  const ring = new Uint32Array(steps * S * stride * 2);
  const eos = vocab.eosIds[0];
  for (let k = 0; k < steps; k++) {
    for (let s = 0; s < S; s++) {
      const w = which[s];
      const n = r.int(tokensPerSlot + 1); // tokens this step (the rest NO_TOKEN)
      for (let j = 0; j < stride; j++) {
        const at = ((k * S + s) * stride + j) * 2;
        let tok = NO_TOKEN;
        if (j < n && j < tokensPerSlot) {
          if (w === undefined) tok = r.int(V);
          else {
            const img = images[w], rec = img[10] + 4 * want[s];
            const pick = randomToken(img, img[rec], r);
            tok = pick === undefined || vocab.eosIds.includes(pick) ? eos : pick;
          }
        }
        // entry `tokensPerSlot` (a verification pass's counts) is never read as a token
        ring[at] = j === tokensPerSlot ? 7 : tok;
        ring[at + 1] = 0x3f800000;
      }
      if (w !== undefined) {
        for (let j = 0; j < tokensPerSlot; j++) {
          const tok = ring[((k * S + s) * stride + j) * 2];
          if (tok === NO_TOKEN) break;
          want[s] = advanceRef(images[w], tokenImage, want[s], tok);
        }
      }
    }
  }
  const bufs = {
    params: createStorage(gpu, params.byteLength, params),
    ring: createStorage(gpu, ring.byteLength, ring),
    tables: createStorage(gpu, words.byteLength, words),
    tokenBytes: createStorage(gpu, tokenImage.byteLength, tokenImage),
    state: createStorage(gpu, state.byteLength, state),
  };
  const ds = Array.from({ length: steps }, (_, k) =>
    advanceDispatch(gpu, bufs, {
      slotBegin: 0,
      slotEnd: S,
      ringOffset: k * S * stride,
      ringStride: stride,
      tokens: tokensPerSlot,
    }));
  await run(gpu, ds);
  assert.deepEqual([...await readU32(gpu, bufs.state, S)], [...want]);
  assert.ok(want.some((s, i) => which[i] !== undefined && s !== 0), "the walks moved");
});
