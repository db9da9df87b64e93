/**
 * Constraints by name: a spec (`response_format`, a tool's schema, a pattern) compiles once into
 * token tables for the model's vocabulary (engine/grammar/, cached per spec), and the engine keeps
 * the compiled images a request may name by key. The worker engine compiles in its tokenizer
 * workers and hands the image to the engine's worker (`register`), so neither the server's
 * thread nor the decode loop spends the milliseconds to a second a schema takes.
 */
import type { Constraint, ConstraintSpec } from "../api/types.ts";
import { InvalidRequestError } from "../api/errors.ts";
import { GrammarCache } from "./grammar/grammar.ts";
import { GrammarError } from "./grammar/errors.ts";
import { tokenBytesImage, type Vocabulary, vocabularyOf } from "./grammar/vocab.ts";
import type { TextTokenizer } from "./model/tokenizer.ts";
import type { GrammarImage } from "./runner/constraints.ts";

/** A compiled constraint: what a request carries, and the tables behind it. */
export interface CompiledConstraint extends Constraint {
  image: Uint32Array;
}

/** The name of a spec's tables: its JSON as sent (property order is part of a schema). */
export function constraintKey(spec: ConstraintSpec): string {
  return JSON.stringify(spec);
}

/** Images kept by key at most (least recently used dropped first). */
const MAX_IMAGES = 256;
/** Image bytes kept at most. */
const MAX_IMAGE_BYTES = 512 * 2 ** 20;

/** Compiles specs for one tokenizer's vocabulary (see the module doc). */
export class ConstraintCompiler {
  #vocab?: Vocabulary;
  #tokenBytes?: Uint32Array;
  readonly #cache = new GrammarCache();

  /** @param vocabSize the model's logits width (config.json vocab_size) */
  constructor(readonly tokenizer: TextTokenizer, readonly vocabSize: number) {}

  /**
   * The vocabulary as bytes, built on first use (a few hundred milliseconds for 128k tokens).
   *
   * @throws InvalidRequestError when the tokenizer's decoder is not one grammars support
   */
  vocabulary(): Vocabulary {
    if (!this.#vocab) {
      try {
        this.#vocab = vocabularyOf(this.tokenizer.tokenizerJson, this.tokenizer, {
          size: this.vocabSize,
        });
      } catch (e) {
        if (e instanceof GrammarError) {
          throw new InvalidRequestError(
            `constrained output is not available for this model: ${e.message}`,
            "response_format",
          );
        }
        throw e;
      }
    }
    return this.#vocab;
  }

  /** The token-bytes image the GPU walks grammar states with. */
  tokenBytes(): Uint32Array {
    return this.#tokenBytes ??= tokenBytesImage(this.vocabulary());
  }

  /**
   * Compiles `spec` (cached).
   *
   * @param path where the spec sits in the request, for messages (default by type)
   * @throws InvalidRequestError naming the unsupported keyword or construct, param `path`
   */
  compile(spec: ConstraintSpec, path?: string): CompiledConstraint {
    const vocab = this.vocabulary();
    try {
      const t = this.#cache.get(vocab, spec, { path });
      return { key: constraintKey(spec), minTokens: t.minTokens, image: t.image };
    } catch (e) {
      if (e instanceof GrammarError) {
        throw new InvalidRequestError(e.message, e.path.split(".")[0] || path || "response_format");
      }
      throw e;
    }
  }
}

/** The compiled images an engine's requests may name (see the module doc). */
export class ConstraintImages {
  readonly #images = new Map<string, Uint32Array>();
  #bytes = 0;

  /** Keeps `image` under `key` (replacing an older one). */
  register(key: string, image: Uint32Array): void {
    const old = this.#images.get(key);
    if (old) {
      this.#images.delete(key);
      this.#bytes -= old.byteLength;
    }
    this.#images.set(key, image);
    this.#bytes += image.byteLength;
    for (const [k, v] of this.#images) {
      if (this.#images.size <= MAX_IMAGES && this.#bytes <= MAX_IMAGE_BYTES) break;
      if (k === key) continue;
      this.#images.delete(k);
      this.#bytes -= v.byteLength;
    }
  }

  /**
   * The image a request's constraint names (marked recently used).
   *
   * @throws InvalidRequestError when it was never compiled here, or was dropped since
   */
  get(c: Constraint): GrammarImage {
    const image = this.#images.get(c.key);
    if (!image) {
      throw new InvalidRequestError(
        "the request's constraint was not compiled by this engine (compileConstraint) or was " +
          "dropped since; compile it again",
        "response_format",
      );
    }
    this.#images.delete(c.key);
    this.#images.set(c.key, image);
    return { key: c.key, image };
  }
}
