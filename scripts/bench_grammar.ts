/**
 * Constrained decoding's compile cost: for a few schemas, the time to build the byte automaton
 * and the token tables, and the tables' size, on the default model's tokenizer and on larger
 * vocabularies synthesised from it (seeded concatenations of its tokens, as BPE merges make;
 * nothing is downloaded). Prints a table; timings are medians of --repeat runs, uncached.
 *
 *   deno run -A scripts/bench_grammar.ts [--model DIR] [--sizes 32000,128256] [--repeat 3]
 */
import { parseArgs } from "node:util";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { characterAutomaton, type GrammarSpec } from "../engine/grammar/grammar.ts";
import { buildTables } from "../engine/grammar/tables.ts";
import {
  tokenBytes,
  type Vocabulary,
  vocabularyFromBytes,
  vocabularyOf,
} from "../engine/grammar/vocab.ts";
import { rng } from "./rng.ts";

const USAGE = `Usage: deno run -A scripts/bench_grammar.ts [options]

Compile time and table bytes of constrained decoding (engine/grammar/) for a few schemas.

Options:
  --model DIR     model folder whose tokenizer is measured (default models/strata-default)
  --sizes LIST    larger vocabularies to synthesise from it, comma-separated (default
                  32000,128256; "" for none): the model's tokens plus seeded concatenations
                  of pairs of them
  --repeat N      runs per measurement, the median is printed (default 3)
  --only NAME     measure one schema (${"person, invoice, enum200, date-time, regex, json_object"})
  -h, --help      this text`;

/** The schemas measured, by name. */
export const BENCH_SPECS: Record<string, GrammarSpec> = {
  person: {
    type: "json_schema",
    strict: true,
    schema: {
      type: "object",
      properties: {
        name: { type: "string" },
        age: { type: "integer" },
        email: { type: "string", format: "email" },
        tags: { type: "array", items: { type: "string", enum: ["admin", "staff", "guest"] } },
        address: {
          type: "object",
          properties: {
            street: { type: "string" },
            city: { type: "string" },
            zip: { type: ["string", "null"] },
          },
          required: ["street", "city", "zip"],
          additionalProperties: false,
        },
      },
      required: ["name", "age", "email", "tags", "address"],
      additionalProperties: false,
    },
  },
  invoice: {
    type: "json_schema",
    schema: {
      type: "object",
      $defs: {
        line: {
          type: "object",
          properties: {
            sku: { type: "string", pattern: "^[A-Z]{3}-\\d{4}$" },
            qty: { type: "integer" },
            price: { type: "number" },
            note: { anyOf: [{ type: "string", maxLength: 40 }, { type: "null" }] },
          },
          required: ["sku", "qty", "price"],
        },
      },
      properties: {
        id: { type: "string", format: "uuid" },
        date: { type: "string", format: "date" },
        lines: { type: "array", items: { $ref: "#/$defs/line" }, minItems: 1 },
        paid: { type: "boolean" },
      },
      required: ["id", "date", "lines"],
    },
  },
  enum200: {
    type: "json_schema",
    schema: { enum: Array.from({ length: 200 }, (_, i) => `option number ${i} of the list`) },
  },
  "date-time": { type: "json_schema", schema: { type: "string", format: "date-time" } },
  regex: { type: "regex", pattern: "(\\+\\d{1,3} )?\\(\\d{3}\\) \\d{3}-\\d{4}" },
  json_object: { type: "json_object" },
};

/** `base` grown to `size` tokens by appending seeded concatenations of two of its tokens. */
export function synthesiseVocabulary(base: Vocabulary, size: number, seed = 1): Vocabulary {
  const tokens: Uint8Array[] = [];
  const seen = new Set<string>();
  for (let id = 0; id < base.size; id++) {
    const b = tokenBytes(base, id);
    tokens.push(b);
    if (b.length > 0) seen.add(b.join(","));
  }
  const pool = tokens.filter((b) => b.length > 0);
  const r = rng(seed);
  while (tokens.length < size) {
    const a = pool[r.int(pool.length)], b = pool[r.int(pool.length)];
    if (a.length + b.length > 24) continue;
    const t = new Uint8Array(a.length + b.length);
    t.set(a), t.set(b, a.length);
    const key = t.join(",");
    if (seen.has(key)) continue;
    seen.add(key);
    tokens.push(t);
    pool.push(t);
  }
  return vocabularyFromBytes(tokens, base.eosIds);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** One row of the table. */
export interface GrammarBenchRow {
  schema: string;
  vocab: number;
  states: number;
  classes: number;
  rows: number;
  blocks: number;
  kib: number;
  automatonMs: number;
  tablesMs: number;
  minTokens: number;
}

/** Measures `spec` on `vocab`, `repeat` times. */
export function measure(
  name: string,
  spec: GrammarSpec,
  vocab: Vocabulary,
  repeat: number,
): GrammarBenchRow {
  const a: number[] = [], t: number[] = [];
  let row: GrammarBenchRow | undefined;
  for (let i = 0; i < repeat; i++) {
    const t0 = performance.now();
    const dfa = characterAutomaton(spec);
    const t1 = performance.now();
    const tables = buildTables(dfa, vocab);
    const t2 = performance.now();
    a.push(t1 - t0), t.push(t2 - t1);
    row = {
      schema: name,
      vocab: vocab.size,
      states: tables.states,
      classes: tables.classes,
      rows: tables.rows,
      blocks: tables.blocks,
      kib: tables.bytes / 1024,
      automatonMs: 0,
      tablesMs: 0,
      minTokens: tables.minTokens,
    };
  }
  return { ...row!, automatonMs: median(a), tablesMs: median(t) };
}

/** The rows as a fixed-width table. */
export function formatRows(rows: GrammarBenchRow[]): string {
  const head = [
    "schema",
    "vocab",
    "states",
    "classes",
    "rows",
    "blocks",
    "KiB",
    "automaton ms",
    "tables ms",
    "total ms",
    "min tokens",
  ];
  const cells = rows.map((r) => [
    r.schema,
    String(r.vocab),
    String(r.states),
    String(r.classes),
    String(r.rows),
    String(r.blocks),
    r.kib.toFixed(1),
    r.automatonMs.toFixed(1),
    r.tablesMs.toFixed(1),
    (r.automatonMs + r.tablesMs).toFixed(1),
    String(r.minTokens),
  ]);
  const width = head.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)));
  const line = (c: string[]) =>
    c.map((x, i) => i === 0 ? x.padEnd(width[i]) : x.padStart(width[i])).join("  ");
  return [line(head), ...cells.map(line)].join("\n");
}

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      model: { type: "string", default: "models/strata-default" },
      sizes: { type: "string", default: "32000,128256" },
      repeat: { type: "string", default: "3" },
      only: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const repeat = Number(values.repeat);
  const sizes = values.sizes === "" ? [] : values.sizes!.split(",").map(Number);
  if (!Number.isInteger(repeat) || repeat < 1 || sizes.some((s) => !Number.isInteger(s) || s < 1)) {
    console.error(
      "--repeat and --sizes take positive integers, e.g. --repeat 3 --sizes 32000,128256",
    );
    Deno.exit(2);
  }
  const names = values.only === undefined ? Object.keys(BENCH_SPECS) : [values.only];
  if (names.some((n) => !(n in BENCH_SPECS))) {
    console.error(`--only takes one of ${Object.keys(BENCH_SPECS).join(", ")}`);
    Deno.exit(2);
  }
  const folder = await loadModelFolder(values.model!);
  const base = vocabularyOf(folder.tokenizerJson, TextTokenizer.load(folder), {
    size: folder.config.vocabSize,
  });
  const vocabs = [
    base,
    ...sizes.filter((s) => s > base.size).map((s) => synthesiseVocabulary(base, s)),
  ];
  const rows: GrammarBenchRow[] = [];
  for (const vocab of vocabs) {
    for (const name of names) rows.push(measure(name, BENCH_SPECS[name], vocab, repeat));
  }
  console.log(formatRows(rows));
}
