/**
 * Reader threads of the file tier: a few workers that read spill files into shared memory and
 * check them (engine/kv/tier_file.ts `readRecord`), so that a restore's reads and checksums run
 * beside the engine's thread instead of on it. Each read is sent to the thread with the fewest
 * in flight; the buffer is shared, so nothing is copied or transferred back.
 *
 * The threads hold the process open only while they start or hold a read (they are unreferenced
 * when idle), so an engine that is never closed does not keep its process alive. A thread that
 * fails (it could not start, or threw) fails the reads it held: they read as missing, and the
 * caller recomputes those blocks.
 */
import { Worker } from "node:worker_threads";

/** One read: the file, the block it should hold, and the shared buffer for its record. */
export interface ReadJob {
  path: string;
  hash: bigint;
  tokens: readonly number[];
  into: Uint8Array<SharedArrayBuffer>;
}

/**
 * A job as it is posted: the shared memory itself rather than a view of it (node:worker_threads
 * clones a view of 700 KB in about 40 ms; the buffer it shares in microseconds).
 */
export interface ReadMessage {
  id: number;
  path: string;
  hash: bigint;
  tokens: readonly number[];
  memory: SharedArrayBuffer;
  offset: number;
  length: number;
}

/** A reader thread and the reads it holds. */
interface Reader {
  worker: Worker;
  pending: Map<number, (ok: boolean) => void>;
  /** Jobs held until the thread says it listens (a message before that would be lost). */
  waiting?: ReadMessage[];
  /** Resolves once the thread listens (or is gone: `listened` is called then too). */
  listening: Promise<void>;
  listened: () => void;
}

/**
 * Reader threads for this machine: none below 4 cores (a thread's messages cost more than it
 * saves there: engine/kv/tier_file.ts), else up to 4, leaving two cores to the engine.
 */
export function readerCount(cores = navigator.hardwareConcurrency ?? 1): number {
  return cores < 4 ? 0 : Math.min(4, cores - 2);
}

/** The reader threads of one file tier (see the module doc). */
export class FileReaders {
  readonly #readers: (Reader | undefined)[];
  #next = 0;

  /** @param count reader threads (≥ 1), started at their first read */
  constructor(readonly count: number) {
    this.#readers = new Array(count).fill(undefined);
  }

  /** Reads `job` on a reader thread; resolves as `readRecord` returns (false: unreadable). */
  read(job: ReadJob): Promise<boolean> {
    let best = 0;
    for (let i = 0; i < this.count; i++) {
      const load = this.#readers[i]?.pending.size ?? 0;
      if (load < (this.#readers[best]?.pending.size ?? 0)) best = i;
    }
    const r = this.#readers[best] ??= this.#start(best);
    const id = this.#next++;
    return new Promise<boolean>((resolve) => {
      r.pending.set(id, resolve);
      if (r.pending.size === 1 && !r.waiting) r.worker.ref();
      const { path, hash, tokens, into } = job;
      const m: ReadMessage = {
        id,
        path,
        hash,
        tokens,
        memory: into.buffer,
        offset: into.byteOffset,
        length: into.byteLength,
      };
      if (r.waiting) r.waiting.push(m);
      else this.#post(r, m);
    });
  }

  /**
   * Starts every thread and resolves once each listens: a measurement of reads (the start-up
   * profile's) should not time a thread starting (a quarter of a second on the H200's host).
   */
  async start(): Promise<void> {
    for (let i = 0; i < this.count; i++) this.#readers[i] ??= this.#start(i);
    await Promise.all(this.#readers.map((r) => r?.listening));
  }

  /** Stops every thread; reads in flight read as missing. */
  close(): void {
    for (let i = 0; i < this.count; i++) {
      const r = this.#readers[i];
      if (r) this.#fail(i, r);
    }
  }

  #post(r: Reader, job: ReadMessage): void {
    try {
      r.worker.postMessage(job);
    } catch {
      this.#settle(r, job.id, false);
    }
  }

  #start(i: number): Reader {
    const worker = new Worker(new URL("./tier_file_reader.ts", import.meta.url));
    let listened!: () => void;
    const listening = new Promise<void>((resolve) => (listened = resolve));
    const r: Reader = { worker, pending: new Map(), waiting: [], listening, listened };
    // Referenced while it starts (someone may wait for it) and while it holds reads.
    worker.on("message", (m: { id: number; ok: boolean } | "ready") => {
      if (m !== "ready") return this.#settle(r, m.id, m.ok);
      const jobs = r.waiting ?? [];
      r.waiting = undefined;
      if (jobs.length === 0) worker.unref();
      for (const job of jobs) this.#post(r, job);
      listened();
    });
    worker.on("error", (e: unknown) => {
      console.error(`strata: a spill file reader thread failed: ${e}`);
      this.#fail(i, r);
    });
    worker.on("exit", () => this.#fail(i, r));
    return r;
  }

  #settle(r: Reader, id: number, ok: boolean): void {
    const resolve = r.pending.get(id);
    if (!resolve) return;
    r.pending.delete(id);
    if (r.pending.size === 0) r.worker.unref();
    resolve(ok);
  }

  /** Thread i is gone (or going): its reads fail, and the next read starts another. */
  #fail(i: number, r: Reader): void {
    if (this.#readers[i] === r) this.#readers[i] = undefined;
    r.listened();
    for (const resolve of r.pending.values()) resolve(false);
    r.pending.clear();
    r.worker.removeAllListeners();
    void r.worker.terminate();
  }
}
