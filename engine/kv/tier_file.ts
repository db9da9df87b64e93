/**
 * The file tier's bytes: one raw binary file per KV block record in a spill folder, named by the
 * block's chained hash (which includes its tenant's scope, engine/kv/blocks.ts `scopeRoot`).
 *
 * A file is a 128-byte header, then the record as the GPU pool copied it out (no compression, no
 * per-element work: written from and read into the caller's buffer as it is):
 *
 * | bytes  | field                                                   |
 * | ------ | ------------------------------------------------------- |
 * | 0–3    | magic `STKV`                                            |
 * | 4–7    | format version (1), u32 little-endian                   |
 * | 8–11   | record bytes, u32                                       |
 * | 12–15  | token count n (≤ 24), u32                               |
 * | 16–23  | the block's chained hash, u64                           |
 * | 24–31  | xxh64 of the record, u64                                |
 * | 32–    | the block's n token ids, u32 each; zeros up to byte 128 |
 *
 * A read checks all of it (a short, corrupt or foreign file reads as missing: the caller
 * recomputes). On a machine of 4 cores or more, reads into shared memory (the host tier's
 * buffers) run on reader threads (engine/kv/tier_file_readers.ts): the checksum is most of a
 * read's time (23 of 33 ms for a 2k-token TinyLlama session's 92 MB on the H200's host), and on
 * the engine's thread it is serial. On fewer cores, a thread's messages cost more than they save
 * (a 2-core machine read 92 MB in 24 ms on its own thread, 69 ms through one reader), and reads
 * stay on the caller's thread, the file IO in the runtime's own threads.
 *
 * Files appear whole: written under a temporary name, then renamed. They are not synced: the
 * folder is this process's cache (the session table that refers to them dies with it, and
 * {@linkcode FileTier.open} clears what an earlier run left); the durable copy of a session is
 * the snapshot store's (engine/sessions/store.ts).
 */
import xxhash from "xxhash-wasm";
import { FileReaders, readerCount } from "./tier_file_readers.ts";

const hasher = await xxhash();

/** Header bytes before the record. */
export const FILE_HEADER = 128;
const MAGIC = 0x564b5453; // "STKV" little-endian
const VERSION = 1;
const MAX_TOKENS = (FILE_HEADER - 32) / 4;
const NAME = /^[0-9a-f]{16}\.kvt(\..+\.tmp)?$/;

/** The files of one spill folder, counted against a byte budget. */
export class FileTier {
  #used = 0;
  readonly #sizes = new Map<bigint, number>();

  #readers?: FileReaders;

  private constructor(
    readonly dir: string,
    readonly budget: number,
    readonly readerThreads: number,
  ) {}

  /**
   * Opens the spill folder `dir` (created when missing) and removes the block files an earlier
   * run left there; other files are left alone.
   *
   * @param budget bytes of files it should hold at most
   * @param o.readers reader threads for reads into shared memory (default: by the cores,
   *   `readerCount`; 0: none)
   */
  static async open(dir: string, budget: number, o: { readers?: number } = {}): Promise<FileTier> {
    if (!(Number.isInteger(budget) && budget >= 0)) {
      throw new Error(`internal error: a file tier budget must be an integer >= 0; got ${budget}`);
    }
    await Deno.mkdir(dir, { recursive: true });
    for await (const e of Deno.readDir(dir)) {
      if (e.isFile && NAME.test(e.name)) await Deno.remove(`${dir}/${e.name}`).catch(() => {});
    }
    return new FileTier(dir, budget, o.readers ?? readerCount());
  }

  /** Bytes of the files written and not removed (headers included). */
  get used(): number {
    return this.#used;
  }

  /** Whether a record of `bytes` more fits within the budget. */
  fits(bytes: number): boolean {
    return this.#used + FILE_HEADER + bytes <= this.budget;
  }

  /** The file of the block with chained hash `hash`. */
  path(hash: bigint): string {
    return `${this.dir}/${hash.toString(16).padStart(16, "0")}.kvt`;
  }

  /** Whether a file for `hash` was written (and not removed) by this tier. */
  has(hash: bigint): boolean {
    return this.#sizes.has(hash);
  }

  /**
   * Writes the record `data` of the block (`hash`, `tokens`) to its file.
   *
   * @returns settled once written; rejects with the file system's error (nothing is counted
   *   then)
   */
  write(hash: bigint, tokens: readonly number[], data: Uint8Array): Promise<void> {
    try {
      this.#writeSync(hash, tokens, data);
      return Promise.resolve();
    } catch (e) {
      return Promise.reject(e);
    }
  }

  #writeSync(hash: bigint, tokens: readonly number[], data: Uint8Array): void {
    if (tokens.length > MAX_TOKENS) {
      throw new Error(`internal error: a spilled block holds at most ${MAX_TOKENS} tokens`);
    }
    const head = new Uint8Array(FILE_HEADER);
    const v = new DataView(head.buffer);
    v.setUint32(0, MAGIC, true);
    v.setUint32(4, VERSION, true);
    v.setUint32(8, data.byteLength, true);
    v.setUint32(12, tokens.length, true);
    v.setBigUint64(16, hash, true);
    v.setBigUint64(24, hasher.h64Raw(data), true);
    tokens.forEach((t, i) => v.setUint32(32 + 4 * i, t, true));
    // Synchronous IO: the spill breaker times a write from its call to its promise's settling,
    // and awaited steps would add whatever else holds this thread meanwhile (the engine's
    // blocking readbacks: seconds on a CPU adapter) to a write of a fraction of a millisecond.
    const path = this.path(hash), tmp = `${path}.${crypto.randomUUID()}.tmp`;
    const f = Deno.openSync(tmp, { write: true, createNew: true });
    try {
      writeAll(f, head);
      writeAll(f, data);
    } catch (e) {
      f.close();
      try {
        Deno.removeSync(tmp);
      } catch { /* already gone */ }
      throw e;
    }
    f.close();
    Deno.renameSync(tmp, path);
    const size = FILE_HEADER + data.byteLength;
    this.#used += size - (this.#sizes.get(hash) ?? 0);
    this.#sizes.set(hash, size);
  }

  /**
   * Reads the record of block (`hash`, `tokens`) into `into` (exactly its size): on a reader
   * thread when `into` is shared memory and the tier has them, else on this one.
   *
   * @returns false when the file is missing, short, or not that block's (header, tokens or
   *   checksum differ); `into` may then hold anything
   */
  async read(hash: bigint, tokens: readonly number[], into: Uint8Array): Promise<boolean> {
    const path = this.path(hash);
    if (this.readerThreads > 0 && into.buffer instanceof SharedArrayBuffer) {
      this.#readers ??= new FileReaders(this.readerThreads);
      return await this.#readers.read({
        path,
        hash,
        tokens,
        into: into as Uint8Array<SharedArrayBuffer>,
      });
    }
    let f: Deno.FsFile;
    try {
      f = await Deno.open(path, { read: true });
    } catch {
      return false;
    }
    try {
      const head = new Uint8Array(FILE_HEADER);
      if (!(await readFull(f, head)) || !headerFits(head, hash, tokens, into.byteLength)) {
        return false;
      }
      // Anything after the record means it is not the file this tier wrote.
      if (!(await readFull(f, into)) || (await f.read(new Uint8Array(1))) !== null) return false;
      return checksumOf(head) === hasher.h64Raw(into);
    } catch {
      return false;
    } finally {
      f.close();
    }
  }

  /**
   * Starts the reader threads (if the tier has them) and resolves once they listen; reads start
   * them anyway, this keeps their start out of a measurement.
   */
  async startReaders(): Promise<void> {
    if (this.readerThreads === 0) return;
    this.#readers ??= new FileReaders(this.readerThreads);
    await this.#readers.start();
  }

  /** Stops the reader threads (a later read starts them again). */
  close(): void {
    this.#readers?.close();
    this.#readers = undefined;
  }

  /** Removes the file of `hash` (if any) and stops counting it. */
  async remove(hash: bigint): Promise<void> {
    const size = this.#sizes.get(hash);
    if (size === undefined) return;
    this.#sizes.delete(hash);
    this.#used -= size;
    await Deno.remove(this.path(hash)).catch(() => {});
  }
}

function writeAll(f: Deno.FsFile, data: Uint8Array): void {
  for (let o = 0; o < data.byteLength;) o += f.writeSync(data.subarray(o));
}

/**
 * Reads the record of block (`hash`, `tokens`) from the file at `path` into `into` (exactly its
 * size), checking as {@linkcode FileTier.read} does, with synchronous IO: a reader thread's work
 * (engine/kv/tier_file_reader.ts).
 *
 * @returns false when the file is missing, short, or not that block's; `into` may then hold
 *   anything
 */
export function readRecord(
  path: string,
  hash: bigint,
  tokens: readonly number[],
  into: Uint8Array,
): boolean {
  let f: Deno.FsFile;
  try {
    f = Deno.openSync(path, { read: true });
  } catch {
    return false;
  }
  try {
    const head = new Uint8Array(FILE_HEADER);
    if (!readFullSync(f, head) || !headerFits(head, hash, tokens, into.byteLength)) return false;
    if (!readFullSync(f, into) || f.readSync(new Uint8Array(1)) !== null) return false;
    return checksumOf(head) === hasher.h64Raw(into);
  } catch {
    return false;
  } finally {
    f.close();
  }
}

/** Whether header `head` is that of block (`hash`, `tokens`) with a record of `bytes`. */
function headerFits(
  head: Uint8Array<ArrayBuffer>,
  hash: bigint,
  tokens: readonly number[],
  bytes: number,
): boolean {
  const v = new DataView(head.buffer);
  return v.getUint32(0, true) === MAGIC && v.getUint32(4, true) === VERSION &&
    v.getUint32(8, true) === bytes && v.getUint32(12, true) === tokens.length &&
    v.getBigUint64(16, true) === hash &&
    tokens.every((t, i) => v.getUint32(32 + 4 * i, true) === t);
}

/** The record's checksum as header `head` has it. */
function checksumOf(head: Uint8Array<ArrayBuffer>): bigint {
  return new DataView(head.buffer).getBigUint64(24, true);
}

/** Fills `into` from `f`; false when the file ends first. */
async function readFull(f: Deno.FsFile, into: Uint8Array): Promise<boolean> {
  for (let o = 0; o < into.byteLength;) {
    const n = await f.read(into.subarray(o));
    if (n === null) return false;
    o += n;
  }
  return true;
}

/** Fills `into` from `f`; false when the file ends first. */
function readFullSync(f: Deno.FsFile, into: Uint8Array): boolean {
  for (let o = 0; o < into.byteLength;) {
    const n = f.readSync(into.subarray(o));
    if (n === null) return false;
    o += n;
  }
  return true;
}
