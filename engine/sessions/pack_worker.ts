/**
 * Worker side of `Packer` (engine/sessions/store.ts): hashes and packs session snapshot blocks
 * (engine/sessions/block_pack.ts) off the main thread, where they would hold up streamed tokens.
 */
import xxhash from "xxhash-wasm";
import { packBlock } from "./block_pack.ts";

/** A request: pack `raw`, a block of `width`-byte elements; answer with the same `id`. */
export interface PackRequest {
  id: number;
  raw: Uint8Array;
  width: number;
}

/** The answer: the block's xxh64 (16 hex digits) and packed bytes, or why it failed. */
export interface PackResponse {
  id: number;
  hash?: string;
  packed?: Uint8Array;
  error?: string;
}

/** The worker's global scope, typed without the worker lib (the rest of the program is not). */
const scope = self as unknown as {
  onmessage: ((e: MessageEvent<PackRequest>) => void) | null;
  postMessage(message: PackResponse, transfer?: Transferable[]): void;
};

// Not awaited at the top: a message arriving before a top-level await settled would be lost.
const hasher = xxhash();

scope.onmessage = async (e) => {
  const { id, raw, width } = e.data;
  try {
    const hash = (await hasher).h64Raw(raw).toString(16).padStart(16, "0");
    const packed = packBlock(raw, width);
    scope.postMessage({ id, hash, packed }, [packed.buffer]);
  } catch (err) {
    scope.postMessage({ id, error: String(err) });
  }
};
