/**
 * Tokenization for the server's thread without stalling it: short texts and id lists are done
 * at once (a millisecond or two), long ones in worker threads (engine/worker/tokenizer_worker.ts),
 * so a client sending a megabyte of prompt never holds up another's request or `/health`. Each
 * worker holds its own tokenizer; a request goes to the one with the least work waiting.
 */
import type { ChatMessage, ChatRenderOptions, ConstraintSpec } from "../../api/types.ts";
import { InvalidRequestError } from "../../api/errors.ts";
import type { TextTokenizer } from "../model/tokenizer.ts";
import type {
  TokenizeRequest,
  TokenizeResponse,
  TokenizerSource,
  TokenizeWork,
} from "./tokenizer_worker.ts";

/** Characters of text (or of a chat's messages) tokenized on the calling thread (≈ 2 ms). */
export const INLINE_CHARS = 2048;
/** Ids decoded on the calling thread. */
export const INLINE_IDS = 1024;
/** Tokenizer workers, started on first use. */
const WORKERS = 2;
/** The load a compile counts as (characters' worth): tokenizing prefers the other worker. */
const GRAMMAR_COST = 1 << 20;

interface Pending {
  resolve: (r: TokenizeResponse) => void;
  reject: (e: Error) => void;
  cost: number;
}

interface Slot {
  worker: Worker;
  pending: Map<number, Pending>;
  /** Characters (or ids) of the requests waiting on it. */
  load: number;
}

/** A tokenizer on this thread for short work and workers for long work. */
export class Tokenizers {
  readonly #slots: Slot[] = [];
  #next = 1;
  #closed = false;

  /**
   * @param tokenizer this thread's tokenizer (short work, and the facts the server needs)
   * @param source what the workers build their tokenizers from
   */
  constructor(readonly tokenizer: TextTokenizer, readonly source: TokenizerSource) {}

  /** Token ids of `text` (with BOS when the tokenizer config says so). */
  encode(text: string): Promise<number[]> {
    if (text.length <= INLINE_CHARS) return Promise.resolve(this.tokenizer.encode(text));
    return this.#ask({ op: "encode", text }, text.length).then((r) => r.ids!);
  }

  /** Token ids of a chat rendered through the model's template (with tools, see ChatRenderOptions). */
  encodeChat(messages: ChatMessage[], options: ChatRenderOptions = {}): Promise<number[]> {
    const size = messages.reduce((n, m) => n + m.content.length, 0) +
      (options.tools ? JSON.stringify(options.tools).length : 0);
    if (size <= INLINE_CHARS) {
      return Promise.resolve().then(() => this.tokenizer.encodeChat(messages, options));
    }
    return this.#ask({ op: "chat", messages, options }, size).then((r) => r.ids!);
  }

  /** Text of `ids`. */
  decode(ids: number[]): Promise<string> {
    if (ids.length <= INLINE_IDS) return Promise.resolve(this.tokenizer.decode(ids));
    return this.#ask({ op: "decode", ids }, ids.length).then((r) => r.text!);
  }

  /**
   * Compiles a constraint in the first worker (whose grammar cache then serves repeats; the
   * tokenizing goes to the other while it works).
   *
   * @throws InvalidRequestError for a spec the compiler refuses
   */
  compile(
    spec: ConstraintSpec,
    path?: string,
  ): Promise<{ key: string; minTokens: number; image: Uint32Array }> {
    return this.#ask({ op: "grammar", spec, path }, GRAMMAR_COST, 0).then((r) => r.constraint!);
  }

  /** Stops the workers; requests still waiting fail. */
  close(): void {
    this.#closed = true;
    for (const s of this.#slots.splice(0)) {
      s.worker.terminate();
      for (const p of s.pending.values()) p.reject(new Error("the tokenizer was closed"));
    }
  }

  #ask(req: TokenizeWork, cost: number, worker?: number): Promise<TokenizeResponse> {
    if (this.#closed) return Promise.reject(new Error("the tokenizer was closed"));
    const slot = worker === undefined ? this.#pick() : this.#nth(worker), id = this.#next++;
    return new Promise<TokenizeResponse>((resolve, reject) => {
      slot.pending.set(id, { resolve, reject, cost });
      slot.load += cost;
      slot.worker.postMessage({ ...req, id } satisfies TokenizeRequest);
    }).then((r) => {
      if (r.invalidParam !== undefined) {
        throw new InvalidRequestError(r.error!, r.invalidParam ?? undefined);
      }
      if (r.error !== undefined) throw new Error(r.error);
      return r;
    });
  }

  /** Worker `i`, starting workers up to it. */
  #nth(i: number): Slot {
    while (this.#slots.length <= i) this.#start();
    return this.#slots[i];
  }

  /** The worker with the least work waiting (started when fewer than WORKERS run). */
  #pick(): Slot {
    const idle = this.#slots.find((s) => s.load === 0);
    if (idle) return idle;
    if (this.#slots.length < WORKERS) return this.#start();
    return this.#slots.reduce((a, b) => (b.load < a.load ? b : a));
  }

  #start(): Slot {
    const worker = new Worker(new URL("./tokenizer_worker.ts", import.meta.url), {
      type: "module",
    });
    const slot: Slot = { worker, pending: new Map(), load: 0 };
    worker.onmessage = (e: MessageEvent<TokenizeResponse>) => {
      const p = slot.pending.get(e.data.id);
      if (!p) return;
      slot.pending.delete(e.data.id);
      slot.load -= p.cost;
      p.resolve(e.data);
    };
    worker.onerror = (e) => {
      e.preventDefault();
      // A worker that died fails what it held; the next request starts another.
      this.#slots.splice(this.#slots.indexOf(slot), 1);
      for (const p of slot.pending.values()) {
        p.reject(new Error(`the tokenizer worker failed: ${e.message}`));
      }
    };
    worker.postMessage({ op: "init", source: this.source } satisfies TokenizeRequest);
    this.#slots.push(slot);
    return slot;
  }
}
