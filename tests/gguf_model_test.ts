/**
 * GGUF model files end to end on the host: seeded random test models written as llama.cpp would
 * (scripts/write_gguf.ts) in every file type, read back by loadModelFolder: the same config as
 * the Hugging Face folder, the same tensors and shapes with llama.cpp's type mix, every value
 * equal to the reference dequantization of what was written (bit-exact for F16/BF16 against the
 * HF values), q/k rows back in HF order, and the float64 reference forward agreeing with the HF
 * folder's.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { parseConfig, ropeInvFreq } from "../engine/model/config.ts";
import { expectedTensors, loadModelFolder, type ModelFolder } from "../engine/model/folder.ts";
import { dequantizeRef } from "../engine/model/gguf_quant.ts";
import { fitLlama3Scaling, llama3Factors, ropeWavelengths } from "../engine/model/gguf_rope.ts";
import { ReferenceModel } from "../engine/model/reference_forward.ts";
import { numel, readTensor } from "../engine/model/safetensors.ts";
import { isQuantized, roundTrip, type StorageType } from "../gpu/dtype.ts";
import { quantize } from "../scripts/gguf_quantize.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { type GgufFileType, tensorTypes, writeGguf } from "../scripts/write_gguf.ts";
import { rng } from "./util.ts";

/** Awkward small shapes; K-quant models need rows of multiples of 256. */
const MODELS: [string, TestModelOptions, GgufFileType[]][] = [
  ["llama f32 GQA 3 heads hd32", {
    dtype: "f32",
    hidden: 96,
    heads: 3,
    kvHeads: 1,
    ffn: 160,
    seed: 2,
  }, ["f32", "f16", "bf16", "q8_0", "q4_0"]],
  ["llama f16 hd64", {
    dtype: "f16",
    hidden: 256,
    heads: 4,
    kvHeads: 2,
    ffn: 512,
    seed: 3,
  }, ["f16", "q4_k_m"]],
  ["qwen2 bf16 tied biases", {
    arch: "qwen2",
    dtype: "bf16",
    hidden: 64,
    heads: 2,
    kvHeads: 1,
    tie: true,
    seed: 4,
  }, ["bf16", "q8_0"]],
  ["llama bf16 llama3-rope explicit head_dim", {
    dtype: "bf16",
    hidden: 64,
    heads: 2,
    kvHeads: 2,
    headDim: 48,
    ropeScaling: "llama3",
    seed: 5,
  }, ["f16"]],
];

/** A tensor's values as float64, whatever its storage. */
async function values(folder: ModelFolder, name: string): Promise<Float64Array> {
  const t = folder.tensors.get(name)!;
  return dequantizeRef(await readTensor(t), t.dtype, numel(t.shape));
}

/** The config fields that must match; the storage dtype and RoPE parameters are compared apart. */
function comparable(folder: ModelFolder) {
  const { torchDtype: _, ropeScaling: __, ...rest } = folder.config;
  return rest;
}

/** The values a tensor of `type` holds after writing `x` with rows of `cols`. */
function stored(x: Float64Array, type: StorageType, cols: number): Float64Array {
  if (!isQuantized(type)) {
    return type === "f32" ? Float64Array.from(x, Math.fround) : roundTrip(x, type);
  }
  return dequantizeRef(quantize(x, type, cols), type, x.length);
}

for (const [label, options, types] of MODELS) {
  Deno.test(`GGUF ${types.join("/")} of a ${label} model reads back as the HF folder`, async () => {
    await withTestModel(options, async (dir) => {
      const hf = await loadModelFolder(dir);
      for (const type of types) {
        const file = join(dir, `model-${type}.gguf`);
        const written = await writeGguf(dir, file, { type });
        const gg = await loadModelFolder(file);
        assert.equal(gg.id, `model-${type}`);
        assert.deepEqual(comparable(gg), comparable(hf), `${type}: config`);
        const freqs = ropeInvFreq(gg.config), want = ropeInvFreq(hf.config);
        freqs.forEach((f, i) => assert.ok(Math.abs(f / want[i] - 1) < 1e-6, `${type}: rope ${i}`));
        assert.equal(gg.generation.bosId, hf.generation.bosId);
        assert.deepEqual([...gg.tensors.keys()].sort(), [...hf.tensors.keys()].sort());
        for (const [name, t] of hf.tensors) {
          const g = gg.tensors.get(name)!;
          assert.deepEqual(g.shape, t.shape, name);
          assert.equal(g.dtype, written.types.get(name), name);
          const cols = t.shape.at(-1)!;
          const want = stored(await values(hf, name), g.dtype, cols);
          assert.deepEqual(await values(gg, name), want, `${type} ${name}`);
        }
      }
    });
  });
}

Deno.test("GGUF Q4_K_M: llama.cpp's type mix (Q6_K LM head, attn_v and ffn_down of use_more_bits layers)", () => {
  const config = parseConfig({
    architectures: ["LlamaForCausalLM"],
    hidden_size: 256,
    intermediate_size: 512,
    num_attention_heads: 4,
    num_hidden_layers: 8,
    vocab_size: 1000,
  }, "a test config");
  const types = tensorTypes(config, expectedTensors(config), "q4_k_m");
  const type = (n: string) => types.get(n);
  assert.equal(type("lm_head.weight"), "q6_k");
  assert.equal(type("model.embed_tokens.weight"), "q4_k");
  assert.equal(type("model.norm.weight"), "f32");
  // use_more_bits(i, 8): i < 1, i >= 7, or (i - 1) % 3 == 2: layers 0, 3, 6, 7
  const more = [0, 3, 6, 7];
  for (let i = 0; i < 8; i++) {
    const want = more.includes(i) ? "q6_k" : "q4_k";
    assert.equal(type(`model.layers.${i}.self_attn.v_proj.weight`), want, `layer ${i} v`);
    assert.equal(type(`model.layers.${i}.mlp.down_proj.weight`), want, `layer ${i} down`);
    assert.equal(type(`model.layers.${i}.self_attn.q_proj.weight`), "q4_k");
    assert.equal(type(`model.layers.${i}.input_layernorm.weight`), "f32");
  }
  // Tied: the embedding is the LM head and gets its type; in Q4_0 files too, not in Q8_0 ones.
  const tied = { ...config, tieEmbeddings: true };
  const embed = (t: GgufFileType) =>
    tensorTypes(tied, expectedTensors(tied), t).get("model.embed_tokens.weight");
  assert.equal(embed("q4_0"), "q6_k");
  assert.equal(embed("q8_0"), "q8_0");
});

Deno.test("GGUF: the float64 reference forward of an F16 file is the HF folder's, bit for bit, and close for Q8_0 and Q4_K_M", async () => {
  const model = { dtype: "f16" as const, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, seed: 8 };
  await withTestModel(model, async (dir) => {
    const hf = await ReferenceModel.load(await loadModelFolder(dir));
    const r = rng(3);
    const prompt = Array.from({ length: 9 }, () => r.int(400));
    const want = hf.forward(prompt);
    // rms |Δ logit| / rms logit: 0.36 for the F16 file if q/k rows stayed in llama.cpp's order.
    for (const [type, tolerance] of [["f16", 0], ["q8_0", 0.05], ["q4_k_m", 0.3]] as const) {
      const file = join(dir, `m-${type}.gguf`);
      await writeGguf(dir, file, { type });
      const got = (await ReferenceModel.load(await loadModelFolder(file))).forward(prompt);
      let se = 0, sv = 0, agree = 0;
      for (let t = 0; t < prompt.length; t++) {
        for (let v = 0; v < want[t].length; v++) {
          se += (got[t][v] - want[t][v]) ** 2;
          sv += want[t][v] ** 2;
        }
        const top = (row: Float64Array) => row.indexOf(Math.max(...row));
        if (top(got[t]) === top(want[t])) agree++;
      }
      const rel = Math.sqrt(se / sv);
      console.log(`${type}: rms Δ logit / rms logit ${rel.toFixed(4)}, argmax agrees ${agree}/9`);
      assert.ok(rel <= tolerance, `${type}: rms Δ logit / rms logit ${rel}`);
    }
  });
});

Deno.test("a folder holding one .gguf loads as that file; with two it asks which", async () => {
  await withTestModel({ seed: 9 }, async (dir) => {
    const only = await Deno.makeTempDir({ prefix: "strata-gguf-" });
    try {
      await writeGguf(dir, join(only, "a.gguf"), { type: "f16" });
      const folder = await loadModelFolder(only);
      assert.equal(folder.dir, only);
      assert.equal(folder.tensors.get("model.embed_tokens.weight")!.file, join(only, "a.gguf"));
      await Deno.copyFile(join(only, "a.gguf"), join(only, "b.gguf"));
      await assert.rejects(
        loadModelFolder(only),
        /holds 2 \.gguf files \(a\.gguf, b\.gguf\) and no config\.json; pass the path of the one to load/,
      );
    } finally {
      await Deno.remove(only, { recursive: true });
    }
  });
});

Deno.test("write_gguf refuses Q4_K_M when llama.cpp would fall back to Q5_0", async () => {
  await withTestModel({ hidden: 64, seed: 10 }, async (dir) => {
    await assert.rejects(
      writeGguf(dir, join(dir, "m.gguf"), { type: "q4_k_m" }),
      /rows of 64 values: llama-quantize would store it as Q5_0/,
    );
  });
});

Deno.test("write_gguf CLI: --help, and a conversion", async () => {
  const run = async (...args: string[]) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "scripts/write_gguf.ts", ...args],
      stdout: "piped",
      stderr: "piped",
    }).output();
    return {
      code: out.code,
      text: new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr),
    };
  };
  const help = await run("--help");
  assert.equal(help.code, 0);
  assert.match(help.text, /--type f32\|f16\|bf16\|q8_0\|q4_0\|q4_k_m/);
  await withTestModel({ seed: 11 }, async (dir) => {
    const file = join(dir, "cli.gguf");
    const done = await run("--in", dir, "--out", file, "--type", "q8_0");
    assert.equal(done.code, 0, done.text);
    assert.match(done.text, /wrote .*cli\.gguf: \d+ bytes, tensors \d+ Q8_0, \d+ F32/);
    assert.equal((await loadModelFolder(file)).tensors.get("lm_head.weight")!.dtype, "q8_0");
    const bad = await run("--in", dir, "--out", file, "--type", "q5_k");
    assert.equal(bad.code, 1);
    assert.match(bad.text, /--type must be one of f32, f16, q4_0, q8_0, q4_k_m, bf16; got 'q5_k'/);
  });
});

Deno.test("rope_freqs.weight: Llama 3.1 and 3.2 scaling comes back exactly; other factors are refused", () => {
  const llama3 = (factor: number, high: number, original: number) => ({
    type: "llama3" as const,
    factor,
    lowFreqFactor: 1,
    highFreqFactor: high,
    originalMaxPositions: original,
  });
  for (const [D, want] of [[128, llama3(8, 4, 8192)], [64, llama3(32, 4, 8192)]] as const) {
    const f = Float32Array.from(llama3Factors(want, ropeWavelengths(D, 500000)));
    assert.deepEqual(fitLlama3Scaling(f, { headDim: D, ropeTheta: 500000, path: "m.gguf" }), want);
  }
  const shape = { headDim: 8, ropeTheta: 10000, path: "m.gguf" };
  assert.equal(fitLlama3Scaling(new Float32Array(4).fill(1), shape), undefined);
  assert.throws(
    () => fitLlama3Scaling(Float32Array.from([1, 3, 2, 8]), shape),
    /rope_freqs\.weight in m\.gguf does not follow Llama 3's shape/,
  );
  assert.throws(
    () => fitLlama3Scaling(Float32Array.from([1, 0.5, 2, 8]), shape),
    /rope_freqs\.weight in m\.gguf holds factors below 1/,
  );
  assert.throws(
    () => fitLlama3Scaling(Float32Array.from([1, 2]), shape),
    /has 2 factors, but the head dimension 8 needs 4/,
  );
});
