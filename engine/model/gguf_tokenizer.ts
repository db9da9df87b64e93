/**
 * The tokenizer of a GGUF file, rebuilt as the Hugging Face `tokenizer.json` and
 * `tokenizer_config.json` objects that `TextTokenizer` loads, so one tokenizer implementation
 * serves both sources.
 *
 * Two GGUF tokenizer models (`tokenizer.ggml.model`):
 * - `llama`: SentencePiece BPE (Llama 1/2, Mistral, TinyLlama): tokens, scores and token types.
 *   Rebuilt as transformers' LlamaConverter does: a BPE with byte fallback whose merges are every
 *   split of every token into two tokens, ranked by the merged token's score (SentencePiece merges
 *   the adjacent pair whose union scores highest; `SentencePieceExtractor`); spaces become "▁",
 *   with one "▁" in front of each piece of text when `add_space_prefix` (llama.cpp's behaviour,
 *   HF's legacy one).
 * - `gpt2`: byte-level BPE (Llama 3, Qwen2, SmolLM): tokens and merges, with the pre-tokenizer
 *   named by `tokenizer.ggml.pre`.
 * Control tokens become special added tokens, user-defined ones non-special added tokens;
 * unused ones (the converter's `[PAD{i}]` fillers up to the model's vocab size) are left out.
 */
import { describe, type GgufHeader, type GgufValue } from "./gguf_format.ts";

/** llama.cpp's token types (`tokenizer.ggml.token_type`). */
export const TOKEN_TYPE = {
  normal: 1,
  unknown: 2,
  control: 3,
  userDefined: 4,
  unused: 5,
  byte: 6,
} as const;

/** SentencePiece's word boundary, U+2581. */
export const SPIECE = "\u2581";

/** The rebuilt tokenizer files and the ids the config needs. */
export interface GgufTokenizer {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  /** Tokens in `tokenizer.ggml.tokens`: the model's vocabulary size. */
  vocabSize: number;
  bosId?: number;
  /** EOS, EOT and EOM ids, then tokens llama.cpp ends generation on by name. */
  eosIds: number[];
}

/**
 * Byte-level pre-tokenizers by llama.cpp's `tokenizer.ggml.pre` name, as Hugging Face writes
 * them in tokenizer.json (the same splits as llama-vocab.cpp's regexes for that name).
 */
export const BPE_PRE: Record<string, { pre: unknown; normalizer?: unknown }> = {
  "gpt-2": { pre: byteLevel(true) },
  "llama-bpe": {
    pre: sequence([
      split(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" +
          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      ),
      byteLevel(false),
    ]),
  },
  qwen2: {
    pre: sequence([
      split(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+" +
          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      ),
      byteLevel(false),
    ]),
    normalizer: { type: "NFC" },
  },
  smollm: {
    pre: sequence([{ type: "Digits", individual_digits: true }, byteLevel(true)]),
  },
};

/** Names of llama.cpp's end-of-generation tokens it recognises by their text (llama-vocab.cpp). */
const EOG_NAMES = new Set([
  "<|eot_id|>",
  "<|im_end|>",
  "<|end|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "<|eom_id|>",
  "<EOT>",
  "_<EOT>",
  "<|end_of_text|>",
  "<end_of_utterance>",
]);

/**
 * Rebuilds the tokenizer of a GGUF file.
 *
 * @param header the parsed header (its `tokenizer.*` keys)
 * @returns tokenizer.json and tokenizer_config.json objects, the vocabulary size, BOS and EOS ids
 * @throws naming the key when the tokenizer model or pre-tokenizer is not one strata rebuilds,
 *   or a required key is missing
 */
export function ggufTokenizer(header: GgufHeader): GgufTokenizer {
  const md = header.metadata, path = header.path;
  const model = md.get("tokenizer.ggml.model");
  const tokens = md.get("tokenizer.ggml.tokens");
  if (!Array.isArray(tokens) || tokens.some((t) => typeof t !== "string")) {
    throw new Error(
      `${path} has no tokenizer.ggml.tokens (a list of strings); strata needs the tokenizer ` +
        `in the file`,
    );
  }
  const list = tokens as string[];
  const types = md.get("tokenizer.ggml.token_type") ?? new Int32Array(list.length);
  if (!ArrayBuffer.isView(types) || types.length !== list.length) {
    throw new Error(`${path}: tokenizer.ggml.token_type must list one type per token`);
  }
  const type = (id: number) => Number(types[id]) || TOKEN_TYPE.normal;
  const id = (key: string): number | undefined => {
    const v = md.get(`tokenizer.ggml.${key}`);
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= list.length) {
      throw new Error(
        `tokenizer.ggml.${key} in ${path} must be a token id below ${list.length}; got ` +
          describe(v),
      );
    }
    return v;
  };
  const flag = (key: string, fallback: boolean) => {
    const v = md.get(`tokenizer.ggml.${key}`);
    return typeof v === "boolean" ? v : fallback;
  };
  let built: { model: Record<string, unknown>; rest: Record<string, unknown> };
  let addBos: boolean;
  if (model === "llama") {
    addBos = flag("add_bos_token", true);
    built = sentencePiece(list, type, {
      scores: md.get("tokenizer.ggml.scores"),
      merges: md.get("tokenizer.ggml.merges"),
      unk: id("unknown_token_id"),
      spacePrefix: flag("add_space_prefix", true),
      path,
    });
  } else if (model === "gpt2") {
    const pre = md.get("tokenizer.ggml.pre");
    if (pre === undefined) {
      throw new Error(
        `${path} names no pre-tokenizer (tokenizer.ggml.pre, written since 2024): re-convert ` +
          `the model with a current llama.cpp`,
      );
    }
    addBos = flag("add_bos_token", pre === "llama-bpe");
    built = byteLevelBpe(list, type, { merges: md.get("tokenizer.ggml.merges"), pre, path });
  } else {
    throw new Error(
      `${path} has a ${describe(model)} tokenizer (tokenizer.ggml.model); strata rebuilds ` +
        `'llama' (SentencePiece) and 'gpt2' (byte-level BPE) tokenizers`,
    );
  }
  const bos = id("bos_token_id"), eos = id("eos_token_id");
  const addEos = flag("add_eos_token", false);
  const text = (i: number | undefined) => (i === undefined ? undefined : list[i]);
  const added = list.flatMap((content, i) => {
    const t = type(i);
    if (t !== TOKEN_TYPE.control && t !== TOKEN_TYPE.userDefined && t !== TOKEN_TYPE.unknown) {
      return [];
    }
    const special = t !== TOKEN_TYPE.userDefined;
    return [{
      id: i,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special,
    }];
  });
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    ...built.rest,
    post_processor: postProcessor(
      addBos && bos !== undefined ? { id: bos, text: list[bos] } : undefined,
      addEos && eos !== undefined ? { id: eos, text: list[eos] } : undefined,
      model === "gpt2",
    ),
    model: built.model,
  };
  const eosIds: number[] = [];
  for (const k of ["eos_token_id", "eot_token_id", "eom_token_id"]) {
    const v = id(k);
    if (v !== undefined && !eosIds.includes(v)) eosIds.push(v);
  }
  list.forEach((t, i) => {
    if (EOG_NAMES.has(t) && !eosIds.includes(i)) eosIds.push(i);
  });
  const template = md.get("tokenizer.chat_template");
  const contextLength = md.get(`${md.get("general.architecture")}.context_length`);
  const tokenizerConfig: Record<string, unknown> = {
    add_bos_token: addBos,
    add_eos_token: addEos,
    bos_token: text(bos) ?? null,
    eos_token: text(eos) ?? null,
    unk_token: text(id("unknown_token_id")) ?? null,
    pad_token: text(id("padding_token_id")) ?? null,
    clean_up_tokenization_spaces: false,
    ...(typeof contextLength === "number" ? { model_max_length: contextLength } : {}),
    ...(typeof template === "string" ? { chat_template: template } : {}),
    tokenizer_class: "PreTrainedTokenizerFast",
  };
  return {
    tokenizerJson,
    tokenizerConfig,
    vocabSize: list.length,
    ...(bos !== undefined ? { bosId: bos } : {}),
    eosIds,
  };
}

interface SentencePieceOptions {
  scores: GgufValue | undefined;
  merges: GgufValue | undefined;
  unk?: number;
  spacePrefix: boolean;
  path: string;
}

function sentencePiece(
  tokens: string[],
  type: (id: number) => number,
  o: SentencePieceOptions,
) {
  const vocab = vocabOf(tokens, type);
  let merges: [string, string][];
  if (Array.isArray(o.merges) && o.merges.length > 0) merges = splitMerges(o.merges, o.path);
  else {
    if (!(o.scores instanceof Float32Array) || o.scores.length !== tokens.length) {
      throw new Error(
        `${o.path}: a 'llama' tokenizer needs tokenizer.ggml.scores, one f32 per token`,
      );
    }
    merges = mergesFromScores(tokens, o.scores, vocab);
  }
  const replace = (from: string, to: string) => ({
    type: "Replace",
    pattern: { String: from },
    content: to,
  });
  const normalizer = o.spacePrefix
    ? {
      type: "Sequence",
      normalizers: [{ type: "Prepend", prepend: SPIECE }, replace(" ", SPIECE)],
    }
    : replace(" ", SPIECE);
  const decoders: unknown[] = [replace(SPIECE, " "), { type: "ByteFallback" }, { type: "Fuse" }];
  if (o.spacePrefix) decoders.push({ type: "Strip", content: " ", start: 1, stop: 0 });
  return {
    model: bpeModel(vocab, merges, {
      unk: o.unk === undefined ? null : tokens[o.unk],
      byteFallback: true,
      ignoreMerges: false,
    }),
    rest: {
      normalizer,
      pre_tokenizer: null,
      decoder: { type: "Sequence", decoders },
    },
  };
}

/**
 * SentencePiece BPE merges from piece scores, as transformers' `SentencePieceExtractor`: for
 * every piece, every split into two pieces of the vocabulary (ordered by their ids), all ranked
 * by the piece's score, highest first (a stable sort: equal scores keep id order).
 */
export function mergesFromScores(
  tokens: string[],
  scores: Float32Array,
  vocab: Record<string, number>,
): [string, string][] {
  const ranked: { l: string; r: string; score: number }[] = [];
  tokens.forEach((piece, i) => {
    const chars = Array.from(piece); // split by code point, as Python slices
    const local: { l: string; r: string; score: number }[] = [];
    for (let k = 1; k < chars.length; k++) {
      const l = chars.slice(0, k).join(""), r = chars.slice(k).join("");
      if (l in vocab && r in vocab) local.push({ l, r, score: scores[i] });
    }
    local.sort((a, b) => vocab[a.l] - vocab[b.l] || vocab[a.r] - vocab[b.r]);
    ranked.push(...local);
  });
  ranked.sort((a, b) => b.score - a.score);
  return ranked.map((m) => [m.l, m.r]);
}

interface ByteLevelOptions {
  merges: GgufValue | undefined;
  pre: GgufValue;
  path: string;
}

function byteLevelBpe(tokens: string[], type: (id: number) => number, o: ByteLevelOptions) {
  if (!Array.isArray(o.merges)) {
    throw new Error(`${o.path}: a 'gpt2' tokenizer needs tokenizer.ggml.merges`);
  }
  const pre = typeof o.pre === "string" ? BPE_PRE[o.pre] : undefined;
  if (!pre) {
    throw new Error(
      `${o.path} uses the ${describe(o.pre)} pre-tokenizer (tokenizer.ggml.pre); strata ` +
        `rebuilds ${Object.keys(BPE_PRE).join(", ")}`,
    );
  }
  return {
    model: bpeModel(vocabOf(tokens, type), splitMerges(o.merges, o.path), {
      unk: null,
      byteFallback: false,
      // llama.cpp's Llama 3 tokenizer takes whole words found in the vocabulary (as HF's).
      ignoreMerges: o.pre === "llama-bpe",
    }),
    rest: {
      normalizer: pre.normalizer ?? null,
      pre_tokenizer: pre.pre,
      decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    },
  };
}

/** Every token but the unused fillers, by text → id (a later duplicate keeps the first id). */
function vocabOf(tokens: string[], type: (id: number) => number): Record<string, number> {
  const vocab: Record<string, number> = {};
  tokens.forEach((t, i) => {
    if (type(i) !== TOKEN_TYPE.unused && !(t in vocab)) vocab[t] = i;
  });
  return vocab;
}

/** GGUF merges are "left right" strings; split at the first space after the first character. */
function splitMerges(merges: GgufValue[], path: string): [string, string][] {
  return merges.map((m) => {
    const at = typeof m === "string" ? m.indexOf(" ", 1) : -1;
    if (at < 0) throw new Error(`${path}: tokenizer.ggml.merges holds '${String(m)}', not "a b"`);
    return [(m as string).slice(0, at), (m as string).slice(at + 1)];
  });
}

function bpeModel(
  vocab: Record<string, number>,
  merges: [string, string][],
  o: { unk: string | null; byteFallback: boolean; ignoreMerges: boolean },
) {
  return {
    type: "BPE",
    dropout: null,
    unk_token: o.unk,
    continuing_subword_prefix: null,
    end_of_word_suffix: null,
    fuse_unk: o.byteFallback,
    byte_fallback: o.byteFallback,
    ignore_merges: o.ignoreMerges,
    vocab,
    merges,
  };
}

/** A token the post-processor adds. */
interface Marker {
  id: number;
  text: string;
}

/** BOS and/or EOS around each sequence, or (none) the byte-level no-op processor. */
function postProcessor(
  bos: Marker | undefined,
  eos: Marker | undefined,
  byteLevelModel: boolean,
): unknown {
  if (bos === undefined && eos === undefined) return byteLevelModel ? byteLevel(true) : null;
  const special = (t: Marker, typeId: number) => ({
    SpecialToken: { id: t.text, type_id: typeId },
  });
  const seq = (s: string, typeId: number) => ({ Sequence: { id: s, type_id: typeId } });
  const wrap = (s: string, typeId: number) => [
    ...(bos !== undefined ? [special(bos, typeId)] : []),
    seq(s, typeId),
    ...(eos !== undefined ? [special(eos, typeId)] : []),
  ];
  const specials: Record<string, unknown> = {};
  for (const t of [bos, eos]) {
    if (t !== undefined) specials[t.text] = { id: t.text, ids: [t.id], tokens: [t.text] };
  }
  return {
    type: "TemplateProcessing",
    single: wrap("A", 0),
    pair: [...wrap("A", 0), ...wrap("B", 1)],
    special_tokens: specials,
  };
}

function byteLevel(useRegex: boolean) {
  return { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex };
}

function sequence(items: unknown[]) {
  return { type: "Sequence", pretokenizers: items };
}

function split(regex: string) {
  return { type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false };
}
