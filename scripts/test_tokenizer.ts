/**
 * A small, valid byte-level BPE tokenizer (tokenizer.json as Hugging Face `tokenizers` writes
 * it), with merges learned deterministically from a built-in English text. Used by
 * make_test_model.ts.
 */

/** The special tokens, in id order after the BPE vocabulary. */
export const SPECIAL_TOKENS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"] as const;

/** A few paragraphs of plain English, enough for a few hundred useful merges. */
export const TRAINING_TEXT = `
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into
the forest. In the morning the farmer walks to the market with his daughter; they sell apples,
bread and cheese. "How much is the bread?" asks a woman. "Two coins," the farmer answers.
Once upon a time there was a small town by the river. The people of the town were kind and they
worked hard. Every evening they told stories about the mountains, the sea and the stars. Children
listened to the stories and dreamed of travelling to faraway places.
A language model reads text one token at a time and predicts the next token. It is trained on
many documents, and it learns which words often follow other words. When you ask it a question,
it writes an answer word by word. Good answers are short, clear and correct.
Hello! How are you today? I am fine, thank you. What would you like to talk about? We can talk
about science, history, music, cooking, or anything else that you find interesting.
The year 2024 had 366 days. There are 7 days in a week, 24 hours in a day and 60 minutes in an
hour. If you walk 5 kilometres every day, you walk 35 kilometres in a week.
def add(a, b):
    return a + b
for i in range(10):
    print(i, add(i, 1))
`;

const PRETOKENIZE = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/** GPT-2's byte → printable character table (ByteLevel pre-tokenizer and decoder). */
export function bytesToUnicode(): string[] {
  const keep: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) keep.push(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.push(b);
  for (let b = 0xae; b <= 0xff; b++) keep.push(b);
  const out = new Array<string>(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    out[b] = String.fromCharCode(keep.includes(b) ? b : 256 + n++);
  }
  return out;
}

/**
 * Learns up to `nMerges` BPE merges from `text` (most frequent pair first; ties broken by the
 * pair's string order, so the result is deterministic). Stops early when every pre-tokenized
 * word is one symbol.
 *
 * @returns merges as `[left, right]` pairs in rank order
 */
export function learnMerges(text: string, nMerges: number): [string, string][] {
  const byteChar = bytesToUnicode();
  const enc = new TextEncoder();
  const counts = new Map<string, number>();
  for (const piece of text.match(PRETOKENIZE) ?? []) {
    const word = Array.from(enc.encode(piece), (b) => byteChar[b]).join("");
    counts.set(word, (counts.get(word) ?? 0) + 1);
  }
  const words = [...counts].map(([w, c]) => ({ syms: Array.from(w), count: c }));
  const merges: [string, string][] = [];
  while (merges.length < nMerges) {
    const pairs = new Map<string, number>();
    for (const { syms, count } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const key = syms[i] + " " + syms[i + 1];
        pairs.set(key, (pairs.get(key) ?? 0) + count);
      }
    }
    let best = "", bestCount = 0;
    for (const [key, c] of pairs) {
      if (c > bestCount || (c === bestCount && key < best)) [best, bestCount] = [key, c];
    }
    if (!best) break;
    const [a, b] = best.split(" ");
    merges.push([a, b]);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          out.push(a + b);
          i++;
        } else out.push(w.syms[i]);
      }
      w.syms = out;
    }
  }
  return merges;
}

/** What {@linkcode buildTokenizer} makes. */
export interface BuiltTokenizer {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  /** Largest id + 1 (BPE vocab + special tokens). */
  size: number;
  /** Ids of the special tokens by content. */
  special: Record<(typeof SPECIAL_TOKENS)[number], number>;
}

/** Options for {@linkcode buildTokenizer}. */
export interface BuildTokenizerOptions {
  /** Merges to learn (fewer if the text runs out of repeated pairs). */
  merges: number;
  /** Prepend `<s>` when encoding and in the chat template. */
  bos: boolean;
  modelMaxLength: number;
}

/** A ChatML-style template; `bos_token` first when the tokenizer uses one. */
function chatTemplate(bos: boolean): string {
  return (bos ? "{{ bos_token }}" : "") +
    "{% for message in messages %}" +
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
    "{% endfor %}" +
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

/** Builds tokenizer.json and tokenizer_config.json for a byte-level BPE tokenizer. */
export function buildTokenizer(options: BuildTokenizerOptions): BuiltTokenizer {
  const byteChar = bytesToUnicode();
  const vocab: Record<string, number> = {};
  let next = 0;
  for (let b = 0; b < 256; b++) vocab[byteChar[b]] = next++;
  const merges = learnMerges(TRAINING_TEXT, options.merges);
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = next++;
  const special = {} as BuiltTokenizer["special"];
  const addedTokens = SPECIAL_TOKENS.map((content) => {
    special[content] = next;
    return {
      id: next++,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    };
  });
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true };
  const bosId = special["<s>"];
  const postProcessor = options.bos
    ? {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [bosId], tokens: ["<s>"] } },
    }
    : { ...byteLevel, use_regex: true };
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: { ...byteLevel, use_regex: true },
    post_processor: postProcessor,
    decoder: { ...byteLevel, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  const addedTokensDecoder: Record<string, unknown> = {};
  for (const { id, ...rest } of addedTokens) addedTokensDecoder[String(id)] = rest;
  const tokenizerConfig = {
    add_bos_token: options.bos,
    add_eos_token: false,
    added_tokens_decoder: addedTokensDecoder,
    bos_token: "<s>",
    eos_token: "</s>",
    pad_token: null,
    unk_token: null,
    chat_template: chatTemplate(options.bos),
    clean_up_tokenization_spaces: false,
    model_max_length: options.modelMaxLength,
    tokenizer_class: "PreTrainedTokenizerFast",
  };
  return { tokenizerJson, tokenizerConfig, size: next, special };
}
