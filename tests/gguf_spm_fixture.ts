/**
 * A small SentencePiece-style BPE tokenizer as Hugging Face writes a Llama 2 tokenizer.json
 * (transformers' LlamaConverter, legacy): `▁` for spaces with one in front of the text, byte
 * fallback pieces `<0x00>`–`<0xFF>`, merges for every split of every piece into two pieces ranked
 * by the piece's score, `<unk>`, `<s>`, `</s>`. Pieces are learned by plain BPE on the English
 * training text of scripts/test_tokenizer.ts, within words, as SentencePiece trains.
 */
import { TRAINING_TEXT } from "../scripts/test_tokenizer.ts";

const SP = "\u2581";

/** What {@linkcode buildSpmTokenizer} makes. */
export interface SpmTokenizer {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  /** Largest id + 1. */
  size: number;
}

/**
 * Builds the tokenizer.
 *
 * @param nMerges pieces to learn (fewer if the text runs out of repeated pairs)
 */
export function buildSpmTokenizer(nMerges: number): SpmTokenizer {
  const normalized = SP + TRAINING_TEXT.replaceAll(" ", SP);
  const counts = new Map<string, number>();
  for (const w of normalized.split(new RegExp(`(?=${SP})`, "u"))) {
    counts.set(w, (counts.get(w) ?? 0) + 1);
  }
  const words = [...counts].map(([w, c]) => ({ syms: Array.from(w), c }));
  const pieces: string[] = [];
  while (pieces.length < nMerges) {
    const pairs = new Map<string, number>();
    for (const { syms, c } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const k = `${syms[i]}\u0000${syms[i + 1]}`;
        pairs.set(k, (pairs.get(k) ?? 0) + c);
      }
    }
    let best = "", bestCount = 1;
    for (const [k, c] of pairs) {
      if (c > bestCount || (c === bestCount && k < best)) [best, bestCount] = [k, c];
    }
    if (!best) break;
    const [a, b] = best.split("\u0000");
    if (!pieces.includes(a + b)) pieces.push(a + b);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (w.syms[i] === a && w.syms[i + 1] === b) {
          out.push(a + b);
          i++;
        } else out.push(w.syms[i]);
      }
      w.syms = out;
    }
  }
  const chars = [...new Set(Array.from(normalized))].sort();
  const vocab: Record<string, number> = {};
  const score = new Map<string, number>();
  const add = (t: string, s: number) => {
    if (t in vocab) return;
    vocab[t] = Object.keys(vocab).length;
    score.set(t, s);
  };
  for (const t of ["<unk>", "<s>", "</s>"]) add(t, 0);
  for (let b = 0; b < 256; b++) add(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, 0);
  pieces.forEach((p, i) => add(p, -i));
  chars.forEach((c, i) => add(c, -pieces.length - i));
  // Every split of every piece into two pieces, by score (then by the halves' ids).
  const merges: [string, string, number][] = [];
  for (const [piece, s] of score) {
    const cs = Array.from(piece);
    const local: [string, string, number][] = [];
    for (let k = 1; k < cs.length; k++) {
      const l = cs.slice(0, k).join(""), r = cs.slice(k).join("");
      if (l in vocab && r in vocab) local.push([l, r, s]);
    }
    local.sort((x, y) => vocab[x[0]] - vocab[y[0]] || vocab[x[1]] - vocab[y[1]]);
    merges.push(...local);
  }
  merges.sort((x, y) => y[2] - x[2]);
  const special = (id: number, content: string) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  });
  const replace = (from: string, to: string) => ({
    type: "Replace",
    pattern: { String: from },
    content: to,
  });
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
    normalizer: {
      type: "Sequence",
      normalizers: [{ type: "Prepend", prepend: SP }, replace(" ", SP)],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [
        replace(SP, " "),
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: "<unk>",
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab,
      merges: merges.map(([l, r]) => [l, r]),
    },
  };
  const tokenizerConfig = {
    add_bos_token: true,
    add_eos_token: false,
    bos_token: "<s>",
    eos_token: "</s>",
    unk_token: "<unk>",
    pad_token: null,
    legacy: true,
    clean_up_tokenization_spaces: false,
    chat_template: "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}" +
      "{% endfor %}",
    tokenizer_class: "LlamaTokenizer",
  };
  return { tokenizerJson, tokenizerConfig, size: Object.keys(vocab).length };
}
