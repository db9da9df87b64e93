/**
 * GGUF model files strata refuses, each with a message naming what is wrong and what to do: an
 * unknown tensor type, architecture or tokenizer, a missing, misshapen or unplaceable tensor, a
 * mixture of experts, RoPE it does not run, inconsistent sizes, truncation. Each is a random test
 * model written as llama.cpp would, with one thing changed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadModelFolder } from "../engine/model/folder.ts";
import { encodeGguf, type GgufSpec } from "../scripts/gguf_writer.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { ggufSpec } from "../scripts/write_gguf.ts";

/** Writes a random test model's GGUF spec, edited by `edit`, and loads it. */
async function loadEdited(edit: (spec: GgufSpec) => void): Promise<string> {
  let message = "";
  await withTestModel({ seed: 21 }, async (dir) => {
    const { spec } = await ggufSpec(dir, { type: "f16" });
    edit(spec);
    const file = join(dir, "edited.gguf");
    await Deno.writeFile(file, encodeGguf(spec));
    try {
      await loadModelFolder(file);
    } catch (e) {
      message = (e as Error).message;
    }
  });
  return message;
}

function setMeta(spec: GgufSpec, key: string, type: string, value: unknown): void {
  spec.metadata = spec.metadata.filter((e) => e.key !== key);
  spec.metadata.push({ key, type, value });
}

const CASES: [string, (spec: GgufSpec) => void, RegExp][] = [
  [
    "an unknown tensor type",
    (s) => (s.tensors.find((t) => t.name === "blk.0.attn_q.weight")!.ggmlType = 13),
    /tensor blk\.0\.attn_q\.weight in .*edited\.gguf is Q5_K; strata reads F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K/,
  ],
  [
    "a type id ggml does not have",
    (s) => (s.tensors[3].ggmlType = 77),
    /is ggml type 77; strata reads F32, F16, BF16/,
  ],
  [
    "another architecture",
    (s) => {
      for (const e of s.metadata) e.key = e.key.replace(/^llama\./, "gemma2.");
      setMeta(s, "general.architecture", "string", "gemma2");
    },
    /is a 'gemma2' model \(general\.architecture\); strata runs llama and qwen2 GGUF files/,
  ],
  [
    "a missing tensor",
    (s) => (s.tensors = s.tensors.filter((t) => t.name !== "blk.1.ffn_down.weight")),
    /missing tensor 'blk\.1\.ffn_down\.weight' \(model\.layers\.1\.mlp\.down_proj\.weight\) in .*edited\.gguf/,
  ],
  [
    "a tensor with no place in a Llama decoder",
    (s) => s.tensors.push({ ...s.tensors[1], name: "blk.0.attn_q_norm.weight" }),
    /tensor 'blk\.0\.attn_q_norm\.weight' in .* has no place in a llama decoder/,
  ],
  [
    "a misshapen tensor",
    (s) => {
      const t = s.tensors.find((t) => t.name === "blk.0.ffn_up.weight")!;
      t.dims = [t.dims[0], t.dims[1] / 2];
    },
    /tensor 'model\.layers\.0\.mlp\.up_proj\.weight' in .* has shape \[64,64\], but its GGUF metadata implies \[128,64\]/,
  ],
  [
    "a mixture of experts",
    (s) => setMeta(s, "llama.expert_count", "u32", 8),
    /is a mixture of experts \(llama\.expert_count = 8\); strata runs dense models/,
  ],
  [
    "YaRN RoPE scaling",
    (s) => setMeta(s, "llama.rope.scaling.type", "string", "yarn"),
    /unsupported RoPE scaling 'yarn' \(llama\.rope\.scaling\.type\) in .*: strata supports Llama 3 scaling \(rope_freqs\.weight\) or none/,
  ],
  [
    "partial RoPE",
    (s) => setMeta(s, "llama.rope.dimension_count", "u32", 8),
    /rotates 8 of each head's 16 dimensions \(llama\.rope\.dimension_count\); strata rotates whole heads/,
  ],
  [
    "per-layer head counts",
    (s) => setMeta(s, "llama.attention.head_count_kv", "array<u32>", Uint32Array.from([2, 2])),
    /llama\.attention\.head_count_kv in .* must be a positive integer; got an array \(per-layer values are not supported\)/,
  ],
  [
    "another tokenizer model",
    (s) => setMeta(s, "tokenizer.ggml.model", "string", "bert"),
    /has a 'bert' tokenizer \(tokenizer\.ggml\.model\); strata rebuilds 'llama' \(SentencePiece\) and 'gpt2'/,
  ],
  [
    "an unknown pre-tokenizer",
    (s) => setMeta(s, "tokenizer.ggml.pre", "string", "falcon"),
    /uses the 'falcon' pre-tokenizer \(tokenizer\.ggml\.pre\); strata rebuilds gpt-2, llama-bpe, qwen2, smollm/,
  ],
  [
    "a token count that contradicts vocab_size",
    (s) => setMeta(s, "llama.vocab_size", "u32", 1000),
    /llama\.vocab_size is 1000 but tokenizer\.ggml\.tokens holds 512 tokens/,
  ],
];

for (const [what, edit, want] of CASES) {
  Deno.test(`GGUF with ${what} is refused, naming it`, async () => {
    assert.match(await loadEdited(edit), want);
  });
}

Deno.test("a truncated GGUF is refused, in the header or in the data", async () => {
  await withTestModel({ seed: 22 }, async (dir) => {
    const { spec } = await ggufSpec(dir, { type: "q8_0" });
    const bytes = encodeGguf(spec);
    const file = join(dir, "cut.gguf");
    await Deno.writeFile(file, bytes.subarray(0, 5000));
    await assert.rejects(
      loadModelFolder(file),
      /cut\.gguf ends inside its GGUF header \(5000 bytes\); the file is truncated: download it again/,
    );
    await Deno.writeFile(file, bytes.subarray(0, bytes.byteLength - 100));
    await assert.rejects(
      loadModelFolder(file),
      /cut\.gguf ends at byte \d+, inside tensor 'output\.weight' .*; the file is truncated/,
    );
  });
});
