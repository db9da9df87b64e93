/**
 * A Hugging Face tokenizer as GGUF `tokenizer.*` metadata, the way llama.cpp's
 * convert_hf_to_gguf.py writes it (test side: what engine/model/gguf_tokenizer.ts must read).
 *
 * - Byte-level BPE (no byte fallback): `gpt2`, as `_set_vocab_gpt2` / `get_vocab_base`: every id
 *   up to the model's vocab_size (`[PAD{id}]` fillers of type UNUSED), added special tokens (and
 *   `<|…|>`-looking ones) CONTROL, other added tokens USER_DEFINED; the merges; the pre-tokenizer
 *   named by what tokenizer.json's pre_tokenizer is (llama.cpp hashes a tokenization instead,
 *   which a test vocabulary matches to no known model).
 * - SentencePiece BPE (byte fallback): `llama`, as `_set_vocab_sentencepiece` would from the
 *   tokenizer.model beside it: token types NORMAL, CONTROL, USER_DEFINED, UNKNOWN, BYTE
 *   (`<0xAB>`), and scores. A folder without tokenizer.model goes through `_set_vocab_llama_hf`
 *   in llama.cpp, which writes −1000 for every score and loses the merge order; here each piece's
 *   score is minus the rank of the first merge that makes it, what tokenizer.model holds.
 * Specials (`SpecialVocab`): bos/eos/unk/pad ids from tokenizer_config.json's tokens (config.json
 * ids otherwise), add_bos/add_eos from tokenizer_config.json or the post-processor, the chat
 * template.
 */
import type { ModelFolder } from "../engine/model/folder.ts";
import { BPE_PRE, SPIECE, TOKEN_TYPE } from "../engine/model/gguf_tokenizer.ts";
import type { GgufEntry } from "./gguf_writer.ts";

type Json = Record<string, unknown>;

/**
 * The `tokenizer.*` entries for a model folder's tokenizer.
 *
 * @param folder the loaded folder (tokenizer.json, tokenizer_config.json, config)
 * @returns metadata entries in the order llama.cpp writes them
 * @throws when the tokenizer is neither byte-level BPE nor SentencePiece BPE, or its
 *   pre-tokenizer is not one engine/model/gguf_tokenizer.ts rebuilds
 */
export function tokenizerEntries(
  folder: Pick<ModelFolder, "tokenizerJson" | "tokenizerConfig" | "config">,
): GgufEntry[] {
  const tj = folder.tokenizerJson, tc = folder.tokenizerConfig;
  const model = tj.model as Json;
  if (model?.type !== "BPE") {
    throw new Error(`tokenizer model '${String(model?.type)}' has no GGUF form here (BPE only)`);
  }
  const vocab = model.vocab as Record<string, number>;
  const added = (tj.added_tokens ?? []) as { id: number; content: string; special?: boolean }[];
  const size = Math.max(folder.config.vocabSize, ...Object.values(vocab).map((i) => i + 1));
  const byId = new Array<string | undefined>(size);
  for (const [t, i] of Object.entries(vocab)) byId[i] = t;
  for (const a of added) byId[a.id] = a.content;
  const addedById = new Map(added.map((a) => [a.id, a]));
  const merges = ((model.merges ?? []) as (string | string[])[]).map((m) =>
    typeof m === "string" ? m : m.join(" ")
  );
  const spm = model.byte_fallback === true;
  const tokens: string[] = [], types: number[] = [];
  for (let i = 0; i < size; i++) {
    const t = byId[i], a = addedById.get(i);
    if (t === undefined) {
      tokens.push(`[PAD${i}]`);
      types.push(TOKEN_TYPE.unused);
    } else if (a) {
      tokens.push(t);
      types.push(a.special || /^<\|.*\|>$/.test(t) ? TOKEN_TYPE.control : TOKEN_TYPE.userDefined);
    } else if (spm && /^<0x[0-9A-Fa-f]{2}>$/.test(t)) {
      tokens.push(t);
      types.push(TOKEN_TYPE.byte);
    } else {
      tokens.push(t);
      types.push(spm && t === model.unk_token ? TOKEN_TYPE.unknown : TOKEN_TYPE.normal);
    }
  }
  const out: GgufEntry[] = [];
  const add = (key: string, type: string, value: unknown) =>
    out.push({ key: `tokenizer.${key}`, type, value });
  if (spm) {
    add("ggml.model", "string", "llama");
    add("ggml.pre", "string", "default");
    add("ggml.tokens", "array<string>", tokens);
    add("ggml.scores", "array<f32>", pieceScores(tokens, types, merges));
    add("ggml.token_type", "array<i32>", Int32Array.from(types));
    add("ggml.add_space_prefix", "bool", prependsSpace(tj));
  } else {
    add("ggml.model", "string", "gpt2");
    add("ggml.pre", "string", preName(tj));
    add("ggml.tokens", "array<string>", tokens);
    add("ggml.token_type", "array<i32>", Int32Array.from(types));
    add("ggml.merges", "array<string>", merges);
  }
  const tokenId = (key: string): number | undefined => {
    const v = tc[key];
    const text = typeof v === "string" ? v : (v as Json | null)?.content;
    const i = typeof text === "string" ? tokens.indexOf(text) : -1;
    return i >= 0 ? i : undefined;
  };
  const ids: [string, number | undefined][] = [
    ["bos_token_id", tokenId("bos_token") ?? folder.config.bosId],
    ["eos_token_id", tokenId("eos_token") ?? folder.config.eosIds[0]],
    ["unknown_token_id", tokenId("unk_token")],
    ["padding_token_id", tokenId("pad_token")],
  ];
  for (const [key, id] of ids) if (id !== undefined) add(`ggml.${key}`, "u32", id);
  const [addBos, addEos] = specialsAdded(tj, tc);
  add("ggml.add_bos_token", "bool", addBos);
  add("ggml.add_eos_token", "bool", addEos);
  const template = chatTemplate(tc.chat_template);
  if (template !== undefined) add("chat_template", "string", template);
  return out;
}

/**
 * SentencePiece scores: minus the rank of the first merge producing a piece; pieces no merge
 * makes (single characters) rank after every merge; bytes and specials score 0.
 */
function pieceScores(tokens: string[], types: number[], merges: string[]): Float32Array {
  const rank = new Map<string, number>();
  merges.forEach((m, r) => {
    const piece = m.replace(" ", "");
    if (!rank.has(piece)) rank.set(piece, r);
  });
  let single = merges.length;
  return Float32Array.from(tokens, (t, i) => {
    if (types[i] !== TOKEN_TYPE.normal) return 0;
    return -(rank.get(t) ?? single++);
  });
}

/** Whether the normalizer puts "▁" in front of the text (llama.cpp's add_space_prefix). */
function prependsSpace(tj: Json): boolean {
  const n = tj.normalizer as Json | null;
  const list = (n?.type === "Sequence" ? n.normalizers : [n]) as (Json | null)[];
  return list.some((x) => x?.type === "Prepend" && x.prepend === SPIECE);
}

/** The llama.cpp pre-tokenizer name whose Hugging Face form tokenizer.json has. */
function preName(tj: Json): string {
  const same = (a: unknown, b: unknown) => JSON.stringify(sorted(a)) === JSON.stringify(sorted(b));
  for (const [name, form] of Object.entries(BPE_PRE)) {
    if (same(tj.pre_tokenizer, form.pre) && same(tj.normalizer ?? null, form.normalizer ?? null)) {
      return name;
    }
  }
  throw new Error(
    `the tokenizer's pre-tokenizer ${JSON.stringify(tj.pre_tokenizer)} is none of those strata ` +
      `maps to a tokenizer.ggml.pre (${Object.keys(BPE_PRE).join(", ")})`,
  );
}

/** A JSON value with object keys sorted, for comparison. */
function sorted(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sorted);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted((v as Json)[k])]));
  }
  return v;
}

/** add_bos / add_eos: tokenizer_config.json's flags, else what the post-processor adds. */
function specialsAdded(tj: Json, tc: Json): [boolean, boolean] {
  const single = ((tj.post_processor as Json | null)?.single ?? []) as Json[];
  const isSpecial = (x: Json | undefined) => x !== undefined && "SpecialToken" in x;
  const bos = typeof tc.add_bos_token === "boolean" ? tc.add_bos_token : isSpecial(single[0]);
  const eos = typeof tc.add_eos_token === "boolean"
    ? tc.add_eos_token
    : single.length > 1 && isSpecial(single[single.length - 1]);
  return [bos, eos];
}

function chatTemplate(t: unknown): string | undefined {
  if (typeof t === "string") return t;
  if (Array.isArray(t)) {
    const named = t as { name: string; template: string }[];
    return (named.find((x) => x.name === "default") ?? named[0])?.template;
  }
  return undefined;
}
