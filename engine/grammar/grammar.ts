/**
 * Constrained decoding's entry points: a grammar (a JSON Schema, any JSON object, or a regular
 * expression) compiled to a byte automaton, then to token tables for one vocabulary, both cached.
 * docs/grammar.md describes the automaton, the table layout and the supported subset.
 *
 * @example
 * ```ts
 * const vocab = vocabularyOf(folder.tokenizerJson, TextTokenizer.load(folder), {
 *   size: folder.config.vocabSize,
 * });
 * const cache = new GrammarCache();
 * const tables = cache.get(vocab, { type: "json_schema", schema, strict: true });
 * // upload tables.image; a slot starts in state 0 and needs max_tokens >= tables.minTokens
 * ```
 */
import { determinize, type Dfa } from "./dfa.ts";
import { Nfa } from "./nfa.ts";
import { regexGrammar } from "./regex.ts";
import { jsonObjectFrag, schemaFrag } from "./schema.ts";
import { buildTables, type GrammarTables } from "./tables.ts";
import type { Vocabulary } from "./vocab.ts";

/** What a request constrains its output to. */
export type GrammarSpec =
  | { type: "json_object" }
  | { type: "json_schema"; schema: unknown; strict?: boolean }
  | { type: "regex"; pattern: string };

/** Options for {@linkcode compileGrammar} and {@linkcode characterAutomaton}. */
export interface GrammarOptions {
  /** Where errors point (default: OpenAI's field of the spec, e.g. `response_format.json_schema.schema`). */
  path?: string;
  /** The most automaton states (default 20 000). */
  maxStates?: number;
}

function defaultPath(spec: GrammarSpec): string {
  if (spec.type === "json_schema") return "response_format.json_schema.schema";
  if (spec.type === "regex") return "pattern";
  return "response_format";
}

/**
 * The minimal byte automaton of `spec` (tokenizer-independent).
 *
 * @throws GrammarError for an unsupported schema feature or pattern construct, naming it
 */
export function characterAutomaton(spec: GrammarSpec, options: GrammarOptions = {}): Dfa {
  const path = options.path ?? defaultPath(spec);
  const frag = spec.type === "json_schema"
    ? schemaFrag(spec.schema, { strict: spec.strict ?? false, path })
    : spec.type === "regex"
    ? regexGrammar(spec.pattern, path)
    : jsonObjectFrag();
  const nfa = new Nfa(8 * (options.maxStates ?? 20_000), path);
  const start = nfa.state();
  const accept = frag(nfa, start);
  return determinize(nfa, { start, accept }, { maxStates: options.maxStates, path });
}

/**
 * The token tables of `spec` for `vocab` (uncached; see {@linkcode GrammarCache}).
 *
 * @throws GrammarError as {@linkcode characterAutomaton}, or when the vocabulary cannot spell it
 */
export function compileGrammar(
  vocab: Vocabulary,
  spec: GrammarSpec,
  options: GrammarOptions = {},
): GrammarTables {
  return buildTables(characterAutomaton(spec, options), vocab, options.path ?? defaultPath(spec));
}

/** Options for {@linkcode GrammarCache}. */
export interface GrammarCacheOptions {
  /** Most tables kept (default 64). */
  maxEntries?: number;
  /** Most image bytes kept (default 512 MiB). */
  maxBytes?: number;
}

/**
 * Compiled tables per (vocabulary, spec), least recently used evicted first. The key is the
 * spec's JSON as sent: property order is part of a schema's meaning (it is the output's order).
 */
export class GrammarCache {
  readonly #entries = new Map<string, GrammarTables>();
  readonly #maxEntries: number;
  readonly #maxBytes: number;
  #bytes = 0;

  constructor(options: GrammarCacheOptions = {}) {
    this.#maxEntries = options.maxEntries ?? 64;
    this.#maxBytes = options.maxBytes ?? 512 * 2 ** 20;
  }

  /** Entries held. */
  get size(): number {
    return this.#entries.size;
  }

  /** Image bytes held. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * The tables of `spec` for `vocab`, compiled on a miss.
   *
   * @throws GrammarError as {@linkcode compileGrammar} (errors are not cached)
   */
  get(vocab: Vocabulary, spec: GrammarSpec, options: GrammarOptions = {}): GrammarTables {
    const key = `${vocab.key}\u0000${options.maxStates ?? ""}\u0000${JSON.stringify(spec)}`;
    const hit = this.#entries.get(key);
    if (hit !== undefined) {
      this.#entries.delete(key);
      this.#entries.set(key, hit);
      return hit;
    }
    const tables = compileGrammar(vocab, spec, options);
    this.#entries.set(key, tables);
    this.#bytes += tables.bytes;
    for (const [k, t] of this.#entries) {
      if (this.#entries.size <= this.#maxEntries && this.#bytes <= this.#maxBytes) break;
      if (k === key) continue;
      this.#entries.delete(k);
      this.#bytes -= t.bytes;
    }
    return tables;
  }
}
