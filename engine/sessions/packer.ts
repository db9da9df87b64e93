/**
 * Packing snapshot blocks off the event loop: a pool of workers (engine/sessions/pack_worker.ts)
 * that hash and pack KV blocks for the session store (engine/sessions/store.ts).
 */
import xxhash from "xxhash-wasm";
import { packBlock } from "./block_pack.ts";
import type { PackRequest, PackResponse } from "./pack_worker.ts";

/** Most packing workers (fewer on machines with fewer cores: one core stays for the server). */
const PACKERS = 4;

const hasher = await xxhash();

/** xxh64 of a block's bytes, as chunk keys name it. */
export function chunkHash(raw: Uint8Array): string {
  return hasher.h64Raw(raw).toString(16).padStart(16, "0");
}

/** A block packed for the store: its hash and packed bytes. */
export interface Packed {
  hash: string;
  packed: Uint8Array;
}

/**
 * Hashes and packs blocks in workers (engine/sessions/pack_worker.ts), so that snapshot writes neither
 * hold the event loop nor fall behind: a TinyLlama block (720 kB of f32 K and V) takes
 * milliseconds, and a burst of sessions brings hundreds. Up to {@linkcode PACKERS} workers,
 * requests dealt out in turn. If a worker fails, later blocks are packed on the calling thread,
 * and so are pending ones whose bytes were copied rather than handed over.
 */
export class Packer {
  readonly #workers: Worker[] = [];
  #broken = false;
  #next = 0;
  readonly #pending = new Map<
    number,
    {
      raw: Uint8Array;
      width: number;
      resolve: (b: Packed) => void;
      reject: (e: Error) => void;
    }
  >();

  /**
   * Packs `raw`. With `give`, a block that is its whole buffer is handed to the worker (and
   * detached here) instead of copied.
   */
  pack(raw: Uint8Array, width: number, give = false): Promise<Packed> {
    if (this.#broken) return Promise.resolve(inPlace(raw, width));
    const id = this.#next++;
    const worker = this.#workers[id % this.#size] ??= this.#start();
    // Transferred, never cloned: posting a view would clone its whole underlying buffer.
    const whole = raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength;
    const sent = give && whole ? raw : raw.slice();
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { raw: sent, width, resolve, reject });
      worker.postMessage({ id, raw: sent, width } satisfies PackRequest, [
        sent.buffer as ArrayBuffer,
      ]);
    });
  }

  /**
   * Starts every worker and has each pack a small block, so the first snapshot does not wait
   * for workers to start and compile their modules (hundreds of milliseconds).
   */
  async warm(): Promise<void> {
    const blocks = Array.from({ length: this.#size }, () => new Uint8Array(64));
    await Promise.all(blocks.map((b) => this.pack(b, 4, true)));
  }

  /** Workers to use: fewer on machines with fewer cores (one core stays for the server). */
  get #size(): number {
    return Math.max(1, Math.min(PACKERS, navigator.hardwareConcurrency - 1));
  }

  #start(): Worker {
    const w = new Worker(new URL("./pack_worker.ts", import.meta.url).href, { type: "module" });
    w.onmessage = (e: MessageEvent<PackResponse>) => {
      const p = this.#pending.get(e.data.id);
      if (!p) return;
      this.#pending.delete(e.data.id);
      const { packed, hash, error } = e.data;
      if (packed && hash) p.resolve({ hash, packed });
      else p.reject(new Error(`packing a block failed: ${error}`));
    };
    w.onerror = (e) => {
      e.preventDefault();
      console.error(`strata: a snapshot worker failed (${e.message}); packing in place`);
      this.#broken = true;
      this.close();
    };
    return w;
  }

  /**
   * Stops the workers. Pending blocks are packed here, or rejected when their bytes went to a
   * worker (flush snapshots before closing the store).
   */
  close(): void {
    for (const w of this.#workers) w?.terminate();
    this.#workers.length = 0;
    for (const [id, p] of this.#pending) {
      this.#pending.delete(id);
      // A transferred buffer is detached: its view reads as empty.
      if (p.raw.buffer.byteLength) p.resolve(inPlace(p.raw, p.width));
      else p.reject(new Error("the snapshot worker stopped before packing a block"));
    }
  }
}

function inPlace(raw: Uint8Array, width: number): Packed {
  return { hash: chunkHash(raw), packed: packBlock(raw, width) };
}
