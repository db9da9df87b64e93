/**
 * Random walks through a grammar's token tables, reading the image as the GPU does
 * (engine/grammar/sample_ref.ts): the helper the grammar tests share.
 */
import { Header, STATE_WORDS, StateRecord } from "../engine/grammar/tables.ts";
import { BLOCK_WORDS } from "../engine/grammar/token_sets.ts";
import { advanceRef, maskRow } from "../engine/grammar/sample_ref.ts";
import { type Rng, rng } from "../scripts/rng.ts";
import { bytesToUnicode } from "../scripts/test_tokenizer.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";

/** Set bits of a u32. */
function popcount(x: number): number {
  x -= (x >>> 1) & 0x55555555;
  x = (x & 0x33333333) + ((x >>> 2) & 0x33333333);
  return (Math.imul((x + (x >>> 4)) & 0x0f0f0f0f, 0x01010101) >>> 24);
}

/** The tokens of mask row `row`, ascending. */
export function rowTokens(image: Uint32Array, row: number): number[] {
  const B = image[Header.rowBlocks], rows = image[Header.rowsOffset];
  const blocks = image[Header.blocksOffset], V = image[Header.vocab];
  const out: number[] = [];
  for (let k = 0; k < B; k++) {
    const id = image[rows + row * B + k];
    if (id === 0) continue;
    for (let w = 0; w < BLOCK_WORDS; w++) {
      let word = image[blocks + id * BLOCK_WORDS + w];
      while (word !== 0) {
        const bit = 31 - Math.clz32(word & -word);
        const t = k * 1024 + w * 32 + bit;
        if (t < V) out.push(t);
        word &= word - 1;
      }
    }
  }
  return out;
}

/** A uniformly random token of mask row `row` (undefined when it is empty). */
export function randomToken(image: Uint32Array, row: number, r: Rng): number | undefined {
  const B = image[Header.rowBlocks], rows = image[Header.rowsOffset];
  const blocks = image[Header.blocksOffset];
  let total = 0;
  const counts: number[] = [];
  for (let k = 0; k < B; k++) {
    const id = image[rows + row * B + k];
    let c = 0;
    if (id !== 0) {
      for (let w = 0; w < BLOCK_WORDS; w++) c += popcount(image[blocks + id * BLOCK_WORDS + w]);
    }
    counts.push(c);
    total += c;
  }
  if (total === 0) return undefined;
  let pick = r.int(total);
  for (let k = 0; k < B; k++) {
    if (pick >= counts[k]) {
      pick -= counts[k];
      continue;
    }
    const id = image[rows + row * B + k];
    for (let w = 0; w < BLOCK_WORDS; w++) {
      let word = image[blocks + id * BLOCK_WORDS + w];
      const c = popcount(word);
      if (pick >= c) {
        pick -= c;
        continue;
      }
      for (; pick > 0; pick--) word &= word - 1;
      return k * 1024 + w * 32 + (31 - Math.clz32(word & -word));
    }
  }
  return undefined;
}

/** A state's record word. */
export function stateWord(
  image: Uint32Array,
  state: number,
  field: keyof typeof StateRecord,
): number {
  return image[image[Header.stateOffset] + state * STATE_WORDS + StateRecord[field]];
}

/** One walk's tokens (EOS excluded), whether it ended on EOS, and the final state. */
export interface Walk {
  ids: number[];
  eos: boolean;
  state: number;
}

/**
 * Walks from the start with a token budget: each step draws a uniformly random token of the
 * allowed row, or with probability `hurry` of the finish row, under the budget rule. Stops on
 * EOS or when the budget is spent.
 */
export function randomWalk(
  image: Uint32Array,
  tokenImage: Uint32Array,
  eosIds: number[],
  o: { budget: number; hurry: number; rng: Rng },
): Walk {
  let state = image[Header.start];
  const ids: number[] = [];
  for (let remaining = o.budget; remaining > 0; remaining--) {
    const hurry = o.rng.next() < o.hurry;
    const row = hurry ? stateWord(image, state, "finishRow") : maskRow(image, state, remaining);
    const t = randomToken(image, row, o.rng);
    if (t === undefined) throw new Error(`dead end: state ${state} has no allowed token`);
    if (eosIds.includes(t)) return { ids, eos: true, state };
    const next = advanceRef(image, tokenImage, state, t);
    if (next === 0xffffffff) throw new Error(`token ${t} allowed in state ${state} walks to DEAD`);
    ids.push(t);
    state = next;
  }
  return { ids, eos: false, state };
}

/** What {@linkcode randomTokenizer} builds. */
export interface RandomTokenizer {
  tokenizerJson: Record<string, unknown>;
  tokenizer: TextTokenizer;
  /** The model's vocab: the tokenizer's plus padding rows no text decodes to. */
  modelVocab: number;
}

const FRAGMENTS = [
  '"',
  "\\",
  "{",
  "}",
  "[",
  "]",
  ":",
  ",",
  " ",
  "  ",
  "\n",
  "\t",
  "\r",
  "a",
  "e",
  "E",
  "x",
  "z",
  "Q",
  "0",
  "1",
  "7",
  "9",
  ".",
  "-",
  "+",
  "/",
  "u",
  "n",
  "t",
  "true",
  "false",
  "null",
  "é",
  "ß",
  "世",
  "🙂",
  "\u0001",
  "\u007f",
  "\u2028",
  '":',
  '",',
  '"}',
  "},",
  "}]",
  "\\n",
  '\\"',
  "\\u00",
  "2024-",
  "T",
  "Z",
  "@",
  "ab",
  "com",
];

/**
 * A seeded byte-level BPE tokenizer with `pieces` random tokens over JSON-ish fragments, some cut
 * in the middle of a UTF-8 character, besides the 256 single bytes and four special tokens; no
 * merges (decoding is all the grammar tests need).
 */
export function randomTokenizer(seed: number, pieces: number): RandomTokenizer {
  const r = rng(seed);
  const byteChar = bytesToUnicode();
  const vocab: Record<string, number> = {};
  let next = 0;
  for (let b = 0; b < 256; b++) vocab[byteChar[b]] = next++;
  const enc = new TextEncoder();
  while (next < 256 + pieces) {
    let text = "";
    for (let n = 1 + r.int(4); n > 0; n--) text += FRAGMENTS[r.int(FRAGMENTS.length)];
    let bytes = enc.encode(text);
    if (r.next() < 0.3 && bytes.length > 1) bytes = bytes.subarray(r.int(bytes.length - 1) + 1);
    const piece = Array.from(bytes, (b) => byteChar[b]).join("");
    if (!(piece in vocab)) vocab[piece] = next++;
  }
  const special = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];
  const addedTokens = special.map((content) => ({
    id: next++,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  const byteLevel = {
    type: "ByteLevel",
    add_prefix_space: false,
    trim_offsets: true,
    use_regex: true,
  };
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, byte_fallback: false, vocab, merges: [] },
  };
  const tokenizer = new TextTokenizer(tokenizerJson, { eos_token: "</s>", bos_token: "<s>" });
  return { tokenizerJson, tokenizer, modelVocab: next + 37 };
}
