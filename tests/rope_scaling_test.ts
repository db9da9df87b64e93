/**
 * `rope_scaling` kinds (engine/model/config.ts): parsing and refusals, and the inverse
 * frequencies and attention factor against values worked out by hand from transformers'
 * modeling_rope_utils formulas; the mask a config asks for.
 */
import assert from "node:assert/strict";
import {
  attentionScale,
  configMask,
  parseConfig,
  ropeAttentionFactor,
  ropeInvFreq,
} from "../engine/model/config.ts";
import { assertClose } from "./util.ts";

const base = {
  architectures: ["LlamaForCausalLM"],
  hidden_size: 32,
  num_attention_heads: 4, // head dim 8: inv_freq = [1, 0.1, 0.01, 0.001] at theta 10000
  num_key_value_heads: 2,
  intermediate_size: 64,
  num_hidden_layers: 1,
  vocab_size: 100,
  rope_theta: 10000,
};
const cfgWith = (rope_scaling: unknown, extra: Record<string, unknown> = {}) =>
  parseConfig({ ...base, max_position_embeddings: 256, rope_scaling, ...extra }, "config.json");
const PLAIN = [1, 0.1, 0.01, 0.001];

Deno.test("rope scaling linear: every frequency divided by the factor", () => {
  const cfg = cfgWith({ rope_type: "linear", factor: 4 });
  assert.deepEqual(cfg.ropeScaling, { type: "linear", factor: 4 });
  assertClose("linear", ropeInvFreq(cfg), PLAIN.map((f) => f / 4), 0, 1e-15);
  assert.equal(ropeAttentionFactor(cfg), 1);
});

Deno.test("rope scaling dynamic: plain RoPE up to max_position_embeddings, NTK past it", () => {
  const cfg = cfgWith({ type: "dynamic", factor: 2 });
  assert.deepEqual(cfg.ropeScaling, { type: "dynamic", factor: 2, originalMaxPositions: 256 });
  assertClose("dynamic at load", ropeInvFreq(cfg), PLAIN, 0, 1e-15);
  assertClose("dynamic at 200", ropeInvFreq(cfg, 200), PLAIN, 0, 1e-15);
  // At 512 = 2 × 256: base · (2 · 2 − 1)^(8 / 6), so inv[i] = (10000 · 3^(4/3))^(−i / 4).
  const b = 10000 * 3 ** (4 / 3);
  assertClose(
    "dynamic at 512",
    ropeInvFreq(cfg, 512),
    [0, 1, 2, 3].map((i) => b ** (-i / 4)),
    0,
    1e-14,
  );
});

Deno.test("rope scaling yarn: the ramp, the blend and the attention factor", () => {
  // Original 64, factor 4 (max_position_embeddings 256 = 4 × 64). The ramp's ends: the dims of
  // 32 and 1 rotations over 64 positions, 8 ln(64 / (2π r)) / (2 ln 10000) = −0.497 and 1.008,
  // truncated to 0 and 2: ramp [0, 0.5, 1, 1], so dims keep [1, 0.5, 0, 0] of their frequency
  // and take the rest ÷ 4.
  const cfg = cfgWith({ rope_type: "yarn", factor: 4, original_max_position_embeddings: 64 });
  assertClose("yarn", ropeInvFreq(cfg), [1, 0.05 + 0.0125, 0.0025, 0.00025], 0, 1e-14);
  const af = 0.1 * Math.log(4) + 1;
  assertClose("attention factor", [ropeAttentionFactor(cfg)], [af], 0, 1e-15);
  assertClose("softmax scale", [attentionScale(cfg)], [af * af / Math.sqrt(8)], 0, 1e-15);
  // Without truncation the ramp runs from 0 to 1.008: dim 1 keeps 1 − 1 / 1.008 of itself.
  const high = (8 * Math.log(64 / (2 * Math.PI))) / (2 * Math.log(10000));
  const untruncated = cfgWith({
    rope_type: "yarn",
    factor: 4,
    original_max_position_embeddings: 64,
    truncate: false,
  });
  const keep = 1 - 1 / high;
  assertClose(
    "yarn, not truncated",
    ropeInvFreq(untruncated),
    [1, 0.1 * keep + 0.025 * (1 - keep), 0.0025, 0.00025],
    0,
    1e-14,
  );
  // Defaults: original = max_position_embeddings; DeepSeek's mscale pair; an explicit factor.
  const plain = cfgWith({ type: "yarn", factor: 2 });
  assert.equal(plain.ropeScaling?.type === "yarn" && plain.ropeScaling.originalMaxPositions, 256);
  const ds = cfgWith({ type: "yarn", factor: 4, mscale: 0.707, mscale_all_dim: 1 });
  const m = (x: number) => 0.1 * x * Math.log(4) + 1;
  assertClose("mscale pair", [ropeAttentionFactor(ds)], [m(0.707) / m(1)], 0, 1e-15);
  const fixed = cfgWith({ type: "yarn", factor: 4, attention_factor: 1.5 });
  assert.equal(ropeAttentionFactor(fixed), 1.5);
});

Deno.test("rope scaling: refusals name the field and what to do", () => {
  assert.throws(
    () => cfgWith({ rope_type: "longrope", factor: 4 }),
    /unsupported rope_scaling type 'longrope' in config.json: strata supports 'llama3', 'linear', 'dynamic', 'yarn'/,
  );
  assert.throws(() => cfgWith({ rope_type: "linear" }), /rope_scaling.factor .* 'linear'/);
  assert.throws(() => cfgWith({ rope_type: "dynamic", factor: -1 }), /rope_scaling.factor/);
  // transformers 4.x takes max_position_embeddings / original as the factor, 5.x the factor.
  assert.throws(
    () => cfgWith({ rope_type: "yarn", factor: 4, original_max_position_embeddings: 256 }),
    /yarn factor 4 differs from max_position_embeddings \/ original_max_position_embeddings = 256 \/ 256; .* set max_position_embeddings to 1024/,
  );
  assert.throws(
    () => cfgWith({ rope_type: "yarn", factor: 4, truncate: "yes" }),
    /rope_scaling.truncate in config.json must be true or false/,
  );
  // transformers v5's rope_parameters carry the type too.
  const v5 = parseConfig({
    ...base,
    max_position_embeddings: 256,
    rope_parameters: { rope_type: "linear", factor: 2, rope_theta: 10000 },
  }, "config.json");
  assert.deepEqual(v5.ropeScaling, { type: "linear", factor: 2 });
});

Deno.test("config mask: Mistral's sliding_window, else causal", () => {
  const mistral = (sliding_window: unknown) =>
    parseConfig({ ...base, architectures: ["MistralForCausalLM"], sliding_window }, "c.json");
  assert.deepEqual(configMask(mistral(37)), { kind: "window", window: 37 });
  assert.deepEqual(configMask(mistral(null)), { kind: "causal" });
  assert.deepEqual(configMask(parseConfig({ ...base, sliding_window: 8 }, "c.json")), {
    kind: "causal",
  }); // Llama has no window: transformers ignores the key
  assert.throws(() => mistral(0), /'sliding_window' in c.json must be a positive integer or null/);
  assert.throws(() => mistral(4.5), /'sliding_window'/);
});
