/**
 * The acceptance criterion of constrained decoding, on the host: the real default model
 * (models/strata-default, float64 reference weights, an incremental decoder checked against
 * ReferenceModel.forward) sampled at temperature 0.8 through the reference constrained sampler
 * and the token tables, with a token budget, gives output that parses and validates, for every
 * seed. The GPU version of this test is the same loop with the kernels in place of the references.
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import {
  linear,
  mlpInto,
  ReferenceModel,
  rmsnorm,
  rope,
} from "../engine/model/reference_forward.ts";
import { compileGrammar, type GrammarSpec } from "../engine/grammar/grammar.ts";
import { advanceRef, sampleGrammarRef } from "../engine/grammar/sample_ref.ts";
import { tokenBytesImage, vocabularyOf } from "../engine/grammar/vocab.ts";
import { validate } from "../engine/grammar/validate.ts";
import { depth } from "./grammar_schemas.ts";

const folder = await loadModelFolder(new URL("../models/strata-default", import.meta.url).pathname);
const tok = TextTokenizer.load(folder);
const model = await ReferenceModel.load(folder);
const cfg = model.config;
const vocab = vocabularyOf(folder.tokenizerJson, tok, { size: cfg.vocabSize });
const tokenImage = tokenBytesImage(vocab);

/** K and V rows per layer, per position. */
type Cache = { k: Float64Array[][]; v: Float64Array[][] };

/** The logits after appending `t` at the next position of `cache` (which grows by one). */
function step(cache: Cache, t: number): Float64Array {
  const { hiddenSize: H, headDim: D, nHeads, nKvHeads } = cfg;
  const pos = cache.k[0].length;
  const x = model.weights.embed.slice(t * H, (t + 1) * H); // [hidden]
  model.weights.layers.forEach((layer, l) => {
    const h = rmsnorm(x, layer.inputNorm, cfg.rmsEps);
    const q = linear(h, layer.q, { bias: layer.qBias }); // [nHeads * D]
    const k = linear(h, layer.k, { bias: layer.kBias }); // [nKvHeads * D]
    const v = linear(h, layer.v, { bias: layer.vBias });
    rope(q, { nHeads, headDim: D, pos, invFreq: model.invFreq });
    rope(k, { nHeads: nKvHeads, headDim: D, pos, invFreq: model.invFreq });
    cache.k[l].push(k), cache.v[l].push(v);
    const attn = new Float64Array(nHeads * D);
    for (let hq = 0; hq < nHeads; hq++) {
      const kv = Math.floor(hq / (nHeads / nKvHeads));
      const s = cache.k[l].map((kk) => {
        let dot = 0;
        for (let d = 0; d < D; d++) dot += q[hq * D + d] * kk[kv * D + d];
        return dot / Math.sqrt(D);
      });
      const m = Math.max(...s), e = s.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b);
      e.forEach((w, j) => {
        for (let d = 0; d < D; d++) attn[hq * D + d] += (w / z) * cache.v[l][j][kv * D + d];
      });
    }
    const o = linear(attn, layer.o, { bias: layer.oBias });
    for (let i = 0; i < H; i++) x[i] += o[i];
    mlpInto(x, layer, cfg.rmsEps);
  });
  return linear(rmsnorm(x, model.weights.norm, cfg.rmsEps), model.weights.lmHead);
}

const emptyCache = (): Cache => ({
  k: model.weights.layers.map(() => []),
  v: model.weights.layers.map(() => []),
});
const fork = (c: Cache): Cache => ({ k: c.k.map((r) => [...r]), v: c.v.map((r) => [...r]) });

const prompt = tok.encodeChat([{ role: "user", content: "Answer with JSON only." }]);
const prefilled = emptyCache();
let promptLogits: Float64Array = new Float64Array();
for (const t of prompt) promptLogits = step(prefilled, t);

Deno.test("the incremental decoder = ReferenceModel.forward", () => {
  const full = model.forward(prompt, { lastOnly: true })[0];
  const diff = Math.max(...full.map((x, i) => Math.abs(x - promptLogits[i])));
  assert.ok(diff < 1e-9, `max |Δ| ${diff}`);
});

/** Samples up to `maxTokens` under `spec` at temperature 0.8; the ids before EOS. */
function generate(spec: GrammarSpec, seed: number, maxTokens: number): number[] {
  const tables = compileGrammar(vocab, spec);
  assert.ok(maxTokens >= tables.minTokens);
  const cache = fork(prefilled);
  let logits: Float64Array = promptLogits, state = 0;
  const ids: number[] = [];
  for (let remaining = maxTokens; remaining > 0; remaining--) {
    const { token } = sampleGrammarRef(logits, tables.image, state, {
      temperature: 0.8,
      topK: 0,
      topP: 0.95,
      minP: 0,
      repetitionPenalty: 1,
      presencePenalty: 0,
      frequencyPenalty: 0,
      seed: BigInt(seed),
      position: prompt.length + ids.length,
      remaining,
    });
    if (vocab.eosIds.includes(token)) break;
    state = advanceRef(tables.image, tokenImage, state, token);
    ids.push(token);
    logits = step(cache, token);
  }
  return ids;
}

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 24 },
    age: { type: "integer" },
    city: { enum: ["Paris", "Tokyo", "Lima"] },
    tags: { type: "array", items: { type: "string", maxLength: 8 }, maxItems: 2 },
  },
  required: ["name", "age", "city", "tags"],
  additionalProperties: false,
};
const SHAPES = {
  type: "array",
  items: {
    anyOf: [
      {
        type: "object",
        properties: { r: { type: "number" } },
        required: ["r"],
        additionalProperties: false,
      },
      { type: "null" },
    ],
  },
  minItems: 1,
  maxItems: 3,
};

Deno.test("the default model at temperature 0.8: schema-valid JSON for every seed", () => {
  for (const [schema, strict] of [[PERSON, true], [SHAPES, false]] as const) {
    for (const seed of [1, 2, 3]) {
      const text = tok.decode(generate({ type: "json_schema", schema, strict }, seed, 48));
      assert.deepEqual(validate(schema, JSON.parse(text)), [], `seed ${seed}: ${text}`);
    }
  }
});

Deno.test("the default model at temperature 0.8: json_object and a regex", () => {
  for (const seed of [1, 2]) {
    const obj = JSON.parse(tok.decode(generate({ type: "json_object" }, seed, 32)));
    assert.ok(obj !== null && typeof obj === "object" && !Array.isArray(obj) && depth(obj) <= 5);
    const text = tok.decode(
      generate({ type: "regex", pattern: "(yes|no), because [a-z ]{1,30}\\." }, seed, 24),
    );
    assert.match(text, /^(yes|no), because [a-z ]{1,30}\.$/);
  }
});
