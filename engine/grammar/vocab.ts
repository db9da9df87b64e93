/**
 * The bytes each token adds to the decoded text, read from tokenizer.json the way its decoder
 * produces them, and a byte trie over them. Grammars run on bytes because a byte-level BPE token
 * may end in the middle of a UTF-8 character.
 *
 * Supported decoders: `ByteLevel` (GPT-2, Llama 3, Qwen, strata-default) and SentencePiece-style
 * chains of `Replace` / `Metaspace` / `ByteFallback` / `Fuse` / `Strip` (Llama 2, TinyLlama,
 * Mistral). Those chains drop one leading space of the first token of a decode; the tables treat
 * the space as written (docs/grammar.md, "Tokenizers").
 */
import type { TextTokenizer } from "../model/tokenizer.ts";
import { GrammarError } from "./errors.ts";

/** A model's vocabulary as bytes. */
export interface Vocabulary {
  /** Mask width: the model's logits per row; ids past the tokenizer's are never allowed. */
  size: number;
  /** [size + 1] byte offsets into `data`: token i is `data[offsets[i] .. offsets[i + 1])`. */
  offsets: Uint32Array;
  /** Concatenated token bytes. Empty tokens (special, unknown, padding) are never allowed. */
  data: Uint8Array;
  /** Tokens that end generation; allowed exactly in accepting states. */
  eosIds: number[];
  /** Identity for caches: a digest of size, EOS ids and every token's bytes. */
  key: string;
}

/** Options for {@linkcode vocabularyOf}. */
export interface VocabularyOptions {
  /**
   * The model's vocab_size: the logits width, which the masks must cover exactly (it may exceed
   * the tokenizer's size; the extra ids are never allowed).
   */
  size: number;
}

type Json = Record<string, unknown>;

/** GPT-2's printable character → byte table (inverse of the ByteLevel pre-tokenizer's). */
function unicodeToBytes(): Map<string, number> {
  const keep = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const out = new Map<string, number>();
  let n = 0;
  for (let b = 0; b < 256; b++) out.set(String.fromCharCode(keep(b) ? b : 256 + n++), b);
  return out;
}

const encoder = new TextEncoder();

/** The pieces of tokenizer.json by id (model vocab, then added tokens). */
function piecesById(tokenizerJson: Json): Map<number, { piece: string; added: boolean }> {
  const model = tokenizerJson.model as Json;
  const out = new Map<number, { piece: string; added: boolean }>();
  const vocab = model?.vocab;
  if (Array.isArray(vocab)) {
    vocab.forEach((v, id) => out.set(id, { piece: String(v[0]), added: false }));
  } else if (vocab && typeof vocab === "object") {
    for (const [piece, id] of Object.entries(vocab as Record<string, number>)) {
      out.set(id, { piece, added: false });
    }
  }
  for (const t of (tokenizerJson.added_tokens ?? []) as { id: number; content: string }[]) {
    out.set(t.id, { piece: t.content, added: true });
  }
  return out;
}

/** Bytes of one non-special token under `decoders` (a flattened Sequence), or undefined. */
type PieceDecoder = (piece: string, added: boolean) => Uint8Array | undefined;

function pieceDecoder(decoder: Json | null | undefined): PieceDecoder {
  const steps: Json[] = decoder?.type === "Sequence"
    ? decoder.decoders as Json[]
    : decoder
    ? [decoder]
    : [];
  const table = unicodeToBytes();
  for (const d of steps) {
    const t = d.type as string;
    if (!["ByteLevel", "Replace", "Metaspace", "ByteFallback", "Fuse", "Strip"].includes(t)) {
      throw new GrammarError(
        "",
        `constrained decoding does not support this model's tokenizer decoder '${t}' (supported: ` +
          "ByteLevel, and Replace/Metaspace/ByteFallback/Fuse/Strip chains)",
        t,
      );
    }
    if (t === "Replace" && typeof (d.pattern as Json)?.String !== "string") {
      throw new GrammarError("", "constrained decoding supports only string Replace decoders", t);
    }
  }
  if (steps.length === 0) {
    throw new GrammarError("", "constrained decoding needs a tokenizer with a decoder");
  }
  return (piece, added) => {
    let text = piece;
    for (const d of steps) {
      switch (d.type) {
        case "ByteLevel": {
          if (added) return encoder.encode(text);
          const bytes = new Uint8Array(text.length);
          for (let i = 0; i < text.length; i++) {
            const b = table.get(text[i]);
            if (b === undefined) return undefined;
            bytes[i] = b;
          }
          return bytes;
        }
        case "Replace":
          text = text.replaceAll((d.pattern as Json).String as string, String(d.content ?? ""));
          break;
        case "Metaspace":
          text = text.replaceAll(String(d.replacement ?? "\u2581"), " ");
          break;
        case "ByteFallback": {
          const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(text);
          if (m !== null && !added) return Uint8Array.of(parseInt(m[1], 16));
          break;
        }
      }
    }
    return encoder.encode(text);
  };
}

/**
 * The vocabulary of a tokenizer: each token's decoded bytes, special tokens excluded (EOS is
 * handled by the grammar tables separately).
 *
 * @param tokenizerJson the model folder's parsed tokenizer.json
 * @param tokenizer the same tokenizer, for its EOS ids and special tokens
 * @throws GrammarError when the decoder is not one the byte view supports
 * @example vocabularyOf(folder.tokenizerJson, TextTokenizer.load(folder), { size: 32000 })
 */
export function vocabularyOf(
  tokenizerJson: Json,
  tokenizer: Pick<TextTokenizer, "eosIds" | "isSpecial" | "vocabSize">,
  options: VocabularyOptions,
): Vocabulary {
  const decode = pieceDecoder(tokenizerJson.decoder as Json | null);
  const pieces = piecesById(tokenizerJson);
  if (options.size < tokenizer.vocabSize) {
    throw new Error(
      `internal error: vocabulary size ${options.size} is below the tokenizer's ${tokenizer.vocabSize}`,
    );
  }
  const size = options.size;
  const tokens: (Uint8Array | undefined)[] = [];
  for (let id = 0; id < size; id++) {
    const p = pieces.get(id);
    tokens.push(p === undefined || tokenizer.isSpecial(id) ? undefined : decode(p.piece, p.added));
  }
  return vocabularyFromBytes(tokens, tokenizer.eosIds);
}

/**
 * A vocabulary from each token's bytes (undefined or empty: never allowed).
 *
 * @example vocabularyFromBytes([enc("a"), enc("b"), undefined], [2])
 */
export function vocabularyFromBytes(
  tokens: (Uint8Array | undefined)[],
  eosIds: number[],
): Vocabulary {
  const offsets = new Uint32Array(tokens.length + 1);
  let total = 0;
  tokens.forEach((t, i) => {
    offsets[i] = total;
    total += t?.length ?? 0;
  });
  offsets[tokens.length] = total;
  const data = new Uint8Array(total);
  tokens.forEach((t, i) => t !== undefined && data.set(t, offsets[i]));
  const eos = eosIds.filter((id) => id >= 0 && id < tokens.length);
  // FNV-1a over the layout: cheap, and a cache miss on a collision costs only a compile.
  let h = 0x811c9dc5;
  const mix = (x: number) => h = Math.imul(h ^ x, 0x01000193) >>> 0;
  for (const o of offsets) mix(o);
  for (const b of data) mix(b);
  for (const e of eos) mix(e);
  return {
    size: tokens.length,
    offsets,
    data,
    eosIds: eos,
    key: `${tokens.length}:${total}:${h.toString(16)}`,
  };
}

/** The bytes of token `id`. */
export function tokenBytes(vocab: Vocabulary, id: number): Uint8Array {
  return vocab.data.subarray(vocab.offsets[id], vocab.offsets[id + 1]);
}

/**
 * A byte trie of the vocabulary's non-empty tokens (EOS aside), nodes numbered in depth-first
 * pre-order with children in byte order: node 0 is the root, node n's subtree is nodes
 * `[n, n + size[n])`, and `parent[n] < n`, so one forward scan can follow every token from a
 * state and skip a refused subtree whole. The tokens whose bytes end at node n are
 * `tokenIds[tokenStart[n] .. tokenStart[n + 1])` (several ids may share bytes).
 */
export interface ByteTrie {
  nodes: number;
  /** The longest token, in bytes. */
  depth: number;
  /** [nodes] the parent of each node (the root's is 0). */
  parent: Uint32Array;
  /** [nodes] the byte on the edge into each node (the root's is 0). */
  byte: Uint8Array;
  /** [nodes] nodes in each subtree, the node itself included. */
  size: Uint32Array;
  /** [nodes + 1] */
  tokenStart: Uint32Array;
  tokenIds: Uint32Array;
}

const tries = new WeakMap<Vocabulary, ByteTrie>();

/** The trie of `vocab` (built once per vocabulary). */
export function byteTrie(vocab: Vocabulary): ByteTrie {
  let trie = tries.get(vocab);
  if (trie === undefined) tries.set(vocab, trie = buildTrie(vocab));
  return trie;
}

/**
 * Built from the tokens in byte order: each token shares its longest common prefix with the one
 * before, so new nodes are created in pre-order along a stack of the current path.
 */
function buildTrie(vocab: Vocabulary): ByteTrie {
  const { offsets, data } = vocab;
  const eos = new Set(vocab.eosIds);
  const ids: number[] = [];
  for (let id = 0; id < vocab.size; id++) {
    if (offsets[id + 1] > offsets[id] && !eos.has(id)) ids.push(id);
  }
  const length = (id: number) => offsets[id + 1] - offsets[id];
  ids.sort((a, b) => {
    for (let i = 0, n = Math.min(length(a), length(b)); i < n; i++) {
      const d = data[offsets[a] + i] - data[offsets[b] + i];
      if (d !== 0) return d;
    }
    return length(a) - length(b) || a - b;
  });
  const parent: number[] = [0], byte: number[] = [0];
  const endNode = new Uint32Array(ids.length);
  const path: number[] = [0]; // path[d] = the node at depth d of the previous token
  let prev = -1, depth = 0;
  ids.forEach((id, k) => {
    const len = length(id);
    let common = 0;
    if (prev >= 0) {
      const n = Math.min(len, length(prev));
      while (common < n && data[offsets[id] + common] === data[offsets[prev] + common]) common++;
    }
    path.length = common + 1;
    for (let d = common; d < len; d++) {
      parent.push(path[d]), byte.push(data[offsets[id] + d]);
      path.push(parent.length - 1);
    }
    endNode[k] = path[len];
    depth = Math.max(depth, len);
    prev = id;
  });
  const n = parent.length;
  const size = new Uint32Array(n).fill(1);
  for (let i = n - 1; i > 0; i--) size[parent[i]] += size[i];
  const tokenStart = new Uint32Array(n + 1);
  for (const node of endNode) tokenStart[node + 1]++;
  for (let i = 0; i < n; i++) tokenStart[i + 1] += tokenStart[i];
  const fill = tokenStart.slice(0, n);
  const tokenIds = new Uint32Array(ids.length);
  ids.forEach((id, k) => tokenIds[fill[endNode[k]]++] = id);
  return {
    nodes: n,
    depth,
    parent: Uint32Array.from(parent),
    byte: Uint8Array.from(byte),
    size,
    tokenStart,
    tokenIds,
  };
}

/**
 * The vocabulary's bytes as one u32 array for the GPU (engine/grammar/tables.ts documents it):
 * word 0 = V, words 1 .. V + 1 = byte offsets, then the bytes packed four per word, little-endian.
 */
export function tokenBytesImage(vocab: Vocabulary): Uint32Array<ArrayBuffer> {
  const V = vocab.size;
  const out = new Uint32Array(V + 2 + Math.ceil(vocab.data.length / 4));
  out[0] = V;
  out.set(vocab.offsets, 1);
  const base = V + 2;
  vocab.data.forEach((b, j) => out[base + (j >> 2)] |= b << (8 * (j & 3)));
  return out;
}
