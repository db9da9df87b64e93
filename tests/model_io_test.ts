/** Model folders: config parsing, safetensors read/write, sharded indexes, validation errors. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { parseConfig } from "../engine/model/config.ts";
import { type DType, encode } from "../gpu/dtype.ts";
import { expectedTensors, loadModelFolder } from "../engine/model/folder.ts";
import {
  readSafetensorsHeader,
  readTensor,
  readTensorInto,
  writeSafetensors,
} from "../engine/model/safetensors.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { rng } from "./util.ts";

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "strata_model_io_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function writeJson(path: string, v: unknown): Promise<void> {
  await Deno.writeTextFile(path, JSON.stringify(v));
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  return JSON.parse(await Deno.readTextFile(path));
}

Deno.test("safetensors: write then read gives the exact bytes, header padded to 8", async () => {
  await withTempDir(async (dir) => {
    const r = rng(7);
    const shapes: [string, DType, number[]][] = [
      ["a.f32", "f32", [3, 5]],
      ["b.f16", "f16", [7]], // odd count: encode() pads 2 bytes, the file must not
      ["c.bf16", "bf16", [2, 3, 4]],
      ["d.scalar", "f32", []],
    ];
    const tensors = shapes.map(([name, dtype, shape]) => ({
      name,
      dtype,
      shape,
      data: encode(r.uniform(shape.reduce((a, b) => a * b, 1), 3), dtype),
    }));
    const path = join(dir, "t.safetensors");
    await writeSafetensors(path, tensors, { metadata: { format: "pt" } });
    const file = await Deno.readFile(path);
    const n = Number(new DataView(file.buffer).getBigUint64(0, true));
    assert.equal(n % 8, 0);
    const header = JSON.parse(new TextDecoder().decode(file.subarray(8, 8 + n)));
    assert.deepEqual(header.__metadata__, { format: "pt" });
    assert.equal(header["b.f16"].dtype, "F16");
    assert.deepEqual(header["b.f16"].data_offsets, [60, 74]);
    const infos = await readSafetensorsHeader(path);
    assert.deepEqual(infos.map((t) => t.name), shapes.map((s) => s[0]));
    for (const [i, info] of infos.entries()) {
      const want = tensors[i].data.subarray(0, info.nbytes);
      assert.equal(info.dtype, tensors[i].dtype);
      assert.deepEqual(info.shape, tensors[i].shape);
      assert.deepEqual(await readTensor(info), want);
      assert.deepEqual(file.subarray(info.offset, info.offset + info.nbytes), want);
      const into = new Uint8Array(info.nbytes + 4).fill(0xee);
      await readTensorInto(info, into);
      assert.deepEqual(into.subarray(0, info.nbytes), want);
      assert.equal(into[info.nbytes], 0xee);
    }
  });
});

for (const arch of ["llama", "mistral", "qwen2"] as const) {
  for (const dtype of ["f32", "f16", "bf16"] as const) {
    Deno.test(`model folder round trip: ${arch} ${dtype}`, async () => {
      await withTempDir(async (dir) => {
        const tie = dtype === "f16";
        await makeTestModel(dir, { arch, dtype, tie, hidden: 48, heads: 4, kvHeads: 2, ffn: 96 });
        const folder = await loadModelFolder(dir);
        const cfg = folder.config;
        assert.equal(folder.id, dir.split("/").at(-1));
        assert.equal(cfg.arch, arch);
        assert.equal(cfg.hiddenSize, 48);
        assert.equal(cfg.headDim, 12);
        assert.equal(cfg.nHeads, 4);
        assert.equal(cfg.nKvHeads, 2);
        assert.equal(cfg.intermediateSize, 96);
        assert.equal(cfg.nLayers, 2);
        assert.equal(cfg.tieEmbeddings, tie);
        assert.equal(cfg.attentionBias, arch === "qwen2");
        assert.equal(cfg.oProjBias, false);
        assert.equal(cfg.torchDtype, { f32: "float32", f16: "float16", bf16: "bfloat16" }[dtype]);
        assert.equal(folder.tensors.has("lm_head.weight"), !tie);
        assert.equal(folder.tensors.has("model.layers.1.self_attn.k_proj.bias"), arch === "qwen2");
        // EOS ids: config.json's </s> merged with generation_config.json's [</s>, <|im_end|>]
        const vocab = folder.tokenizerJson.added_tokens as { id: number; content: string }[];
        const id = (c: string) => vocab.find((t) => t.content === c)!.id;
        assert.deepEqual(cfg.eosIds, [id("</s>"), id("<|im_end|>")]);
        assert.deepEqual(folder.generation.eosIds, cfg.eosIds);
        assert.equal(cfg.bosId, id("<s>"));
        const want = expectedTensors(cfg);
        assert.equal(folder.tensors.size, want.size);
        let total = 0;
        const file = await Deno.readFile(join(dir, "model.safetensors"));
        for (const [name, shape] of want) {
          const t = folder.tensors.get(name)!;
          assert.deepEqual(t.shape, shape, name);
          assert.equal(t.dtype, dtype);
          const bytes = await readTensor(t);
          assert.equal(
            bytes.byteLength,
            shape.reduce((a, b) => a * b, 1) * (dtype === "f32" ? 4 : 2),
          );
          assert.deepEqual(bytes, file.subarray(t.offset, t.offset + t.nbytes));
          total += t.nbytes;
        }
        assert.equal(folder.totalBytes, total);
      });
    });
  }
}

Deno.test("sharded index: two shards load like one file", async () => {
  await withTempDir(async (dir) => {
    await makeTestModel(dir, { arch: "qwen2", dtype: "bf16" });
    const single = await loadModelFolder(dir);
    const names = [...single.tensors.keys()];
    const shards = [names.slice(0, 9), names.slice(9)];
    const weightMap: Record<string, string> = {};
    for (const [i, shard] of shards.entries()) {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      const tensors = [];
      for (const name of shard.toReversed()) {
        const t = single.tensors.get(name)!;
        tensors.push({ name, dtype: t.dtype, shape: t.shape, data: await readTensor(t) });
        weightMap[name] = file;
      }
      await writeSafetensors(join(dir, file), tensors);
    }
    const originals = new Map<string, Uint8Array>();
    for (const [name, t] of single.tensors) originals.set(name, await readTensor(t));
    await Deno.remove(join(dir, "model.safetensors"));
    await writeJson(join(dir, "model.safetensors.index.json"), {
      metadata: { total_size: single.totalBytes },
      weight_map: weightMap,
    });
    const sharded = await loadModelFolder(dir);
    assert.equal(sharded.tensors.size, single.tensors.size);
    assert.equal(sharded.totalBytes, single.totalBytes);
    for (const [name, t] of sharded.tensors) {
      assert.equal(t.file, join(sharded.dir, weightMap[name]));
      assert.deepEqual(await readTensor(t), originals.get(name), name);
    }
    await Deno.remove(join(dir, "model-00002-of-00002.safetensors"));
    await assert.rejects(
      loadModelFolder(dir),
      /missing weight shard .*model-00002-of-00002\.safetensors \(listed in model\.safetensors\.index\.json\)/,
    );
  });
});

Deno.test("model folder errors name the missing file or bad setting", async () => {
  await withTempDir(async (dir) => {
    await makeTestModel(dir, {});
    const cfgPath = join(dir, "config.json");
    const cfg = await readJson(cfgPath);
    await assert.rejects(loadModelFolder(join(dir, "nope")), /model folder .*nope does not exist/);

    await writeJson(cfgPath, { ...cfg, architectures: ["GPT2LMHeadModel"] });
    await assert.rejects(
      loadModelFolder(dir),
      {
        message: `unsupported architecture 'GPT2LMHeadModel' in ${cfgPath}: strata supports ` +
          `LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM`,
      },
    );
    await writeJson(cfgPath, { ...cfg, rope_scaling: { rope_type: "longrope", factor: 4 } });
    await assert.rejects(
      loadModelFolder(dir),
      /unsupported rope_scaling type 'longrope' in .*config\.json/,
    );
    await writeJson(cfgPath, { ...cfg, hidden_size: undefined });
    await assert.rejects(loadModelFolder(dir), /missing 'hidden_size' in .*config\.json/);
    await writeJson(cfgPath, { ...cfg, intermediate_size: 100 });
    await assert.rejects(
      loadModelFolder(dir),
      /tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' in .*model\.safetensors has shape \[128,64\], but config\.json implies \[100,64\]/,
    );
    await writeJson(cfgPath, { ...cfg, tie_word_embeddings: true });
    const tied = await loadModelFolder(dir); // an extra lm_head is fine
    assert.equal(tied.config.tieEmbeddings, true);

    await writeJson(cfgPath, cfg);
    await Deno.rename(join(dir, "tokenizer.json"), join(dir, "tok.json"));
    await assert.rejects(loadModelFolder(dir), /missing tokenizer\.json in model folder/);
    await Deno.rename(join(dir, "tok.json"), join(dir, "tokenizer.json"));
    await Deno.rename(join(dir, "model.safetensors"), join(dir, "w.bin"));
    await assert.rejects(
      loadModelFolder(dir),
      /missing weights in .*: expected model\.safetensors or model\.safetensors\.index\.json/,
    );
    await Deno.rename(join(dir, "w.bin"), join(dir, "model.safetensors"));
    await Deno.remove(cfgPath);
    await assert.rejects(loadModelFolder(dir), /missing config\.json in model folder/);
  });
});

Deno.test("safetensors: unsupported dtype names the tensor", async () => {
  await withTempDir(async (dir) => {
    const raw = (header: unknown, dataBytes: number) => {
      const h = new TextEncoder().encode(JSON.stringify(header));
      const bytes = new Uint8Array(8 + h.byteLength + dataBytes);
      new DataView(bytes.buffer).setBigUint64(0, BigInt(h.byteLength), true);
      bytes.set(h, 8);
      return bytes;
    };
    const embed = { dtype: "F32", shape: [2], data_offsets: [0, 8] };
    const path = join(dir, "model.safetensors");
    await Deno.writeFile(
      path,
      raw({
        "model.embed_tokens.weight": embed,
        "some.counter": { dtype: "I64", shape: [1], data_offsets: [8, 16] },
      }, 16),
    );
    await assert.rejects(
      readSafetensorsHeader(path),
      {
        message: `tensor 'some.counter' in ${path} has dtype I64: strata loads F32, F16 and ` +
          `BF16 weights; use an unquantized checkpoint or convert it (e.g. to bfloat16)`,
      },
    );
    await Deno.writeFile(path, raw({ "model.embed_tokens.weight": embed }, 4));
    await assert.rejects(readSafetensorsHeader(path), /truncated or corrupt/);
  });
});

Deno.test("parseConfig: defaults, head_dim, GQA, Llama attention_bias, llama3 scaling", () => {
  const base = {
    architectures: ["LlamaForCausalLM"],
    hidden_size: 2048,
    intermediate_size: 5632,
    num_hidden_layers: 22,
    num_attention_heads: 32,
    num_key_value_heads: 4,
    vocab_size: 32000,
    eos_token_id: 2,
    bos_token_id: 1,
  };
  const c = parseConfig(base, "x/config.json");
  assert.equal(c.headDim, 64);
  assert.equal(c.rmsEps, 1e-6);
  assert.equal(c.ropeTheta, 10000);
  assert.equal(c.maxPositions, 2048);
  assert.equal(c.ropeScaling, undefined);
  assert.deepEqual(c.eosIds, [2]);
  assert.equal(c.bosId, 1);
  assert.equal(c.tieEmbeddings, false);
  const d = parseConfig({
    ...base,
    head_dim: 128,
    attention_bias: true,
    eos_token_id: [128001, 128008, 128009],
    rope_scaling: {
      rope_type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    },
  }, "y");
  assert.equal(d.headDim, 128);
  assert.equal(d.attentionBias, true);
  assert.equal(d.oProjBias, true);
  assert.deepEqual(d.eosIds, [128001, 128008, 128009]);
  assert.deepEqual(d.ropeScaling, {
    type: "llama3",
    factor: 8,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPositions: 8192,
  });
  const q = parseConfig({ ...base, architectures: ["Qwen2ForCausalLM"], bos_token_id: null }, "q");
  assert.equal(q.attentionBias, true);
  assert.equal(q.oProjBias, false);
  assert.equal(q.bosId, undefined);
  const m = parseConfig(
    { ...base, architectures: ["MistralForCausalLM"], sliding_window: 4096 },
    "m",
  );
  assert.equal(m.slidingWindow, 4096);
  assert.throws(
    () => parseConfig({ ...base, num_key_value_heads: 5 }, "z"),
    /num_attention_heads \(32\) in z must be a multiple of num_key_value_heads \(5\)/,
  );
  assert.throws(
    () => parseConfig({ ...base, hidden_act: "gelu" }, "z"),
    /unsupported hidden_act 'gelu' in z/,
  );
});
