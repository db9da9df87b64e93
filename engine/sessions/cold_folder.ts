/**
 * The session store's cold tier: one file per chunk, `<hash>-<width>.kvb` in a folder, holding
 * the chunk's packed bytes. Files appear whole: each is written and synced under a temporary
 * name, renamed, and the folder synced (engine/sessions/store.ts commits a chunk's move only
 * after that).
 */

/** A chunk to write: its name (hash, element width) and packed bytes. */
export interface ColdChunk {
  hash: string;
  width: number;
  data: Uint8Array;
}

/** Options of {@linkcode ColdFolder.sweep}. */
export interface SweepOptions {
  /** Whether the file of this chunk holds a chunk the store keeps in files. */
  keep: (hash: string, width: number) => boolean;
  /** Files last modified before this time (ms since the epoch) may go. */
  olderThan: number;
}

const NAME = /^([0-9a-f]{16})-([0-9]+)\.kvb(\..+\.tmp)?$/;

/** The files of one cold folder. */
export class ColdFolder {
  constructor(readonly dir: string) {}

  /** The file of chunk (hash, width). */
  path(hash: string, width: number): string {
    return `${this.dir}/${hash}-${width}.kvb`;
  }

  /** The chunk's bytes, or undefined when it has no file. */
  async read(hash: string, width: number): Promise<Uint8Array<ArrayBuffer> | undefined> {
    return await unlessMissing(Deno.readFile(this.path(hash, width)));
  }

  /** The size of the chunk's file, or undefined when it has none. */
  async size(hash: string, width: number): Promise<number | undefined> {
    return (await unlessMissing(Deno.stat(this.path(hash, width))))?.size;
  }

  /** Removes the chunk's file, if any. */
  async remove(hash: string, width: number): Promise<void> {
    await unlessMissing(Deno.remove(this.path(hash, width)));
  }

  /**
   * Writes each chunk to its file, durably: all written and synced under temporary names at once
   * (their syncs overlap), renamed, then the folder synced. Resolves with `chunks` as given
   * (undefined entries are skipped) once every file is in place.
   */
  async writeDurable<T extends ColdChunk>(chunks: (T | undefined)[]): Promise<(T | undefined)[]> {
    await Deno.mkdir(this.dir, { recursive: true });
    await Promise.all(chunks.map(async (c) => {
      if (!c) return;
      const path = this.path(c.hash, c.width);
      const tmp = `${path}.${crypto.randomUUID()}.tmp`;
      const f = await Deno.open(tmp, { write: true, createNew: true });
      try {
        let o = 0;
        while (o < c.data.byteLength) o += await f.write(c.data.subarray(o));
        await f.syncData();
      } finally {
        f.close();
      }
      await Deno.rename(tmp, path);
    }));
    const d = await Deno.open(this.dir, { read: true }); // the renames, durable before commits
    try {
      await d.syncData();
    } finally {
      d.close();
    }
    return chunks;
  }

  /**
   * Removes every file older than `olderThan` that is a temporary file or the file of a chunk
   * `keep` does not claim. Files of other names are left alone.
   */
  async sweep(o: SweepOptions): Promise<void> {
    const names = await unlessMissing(Array.fromAsync(Deno.readDir(this.dir)));
    for (const { name, isFile } of names ?? []) {
      const m = name.match(NAME);
      if (!isFile || !m) continue;
      if (!m[3] && o.keep(m[1], Number(m[2]))) continue;
      const path = `${this.dir}/${name}`;
      const stat = await Deno.stat(path).catch(() => undefined);
      if (stat && (stat.mtime?.getTime() ?? 0) <= o.olderThan) {
        await Deno.remove(path).catch(() => {});
      }
    }
  }
}

/** `p`'s value, or undefined when it failed because its file or folder is not there. */
export async function unlessMissing<T>(p: Promise<T>): Promise<T | undefined> {
  try {
    return await p;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw e;
  }
}
