/**
 * Worker side of `Packer` (engine/session_store.ts): packs session snapshot blocks
 * (engine/kv_codec.ts) off the main thread, where they would hold up streamed tokens.
 */
import { packBlock } from "./kv_codec.ts";

/** A request: pack `raw`, a block of `width`-byte elements; answer with the same `id`. */
export interface PackRequest {
  id: number;
  raw: Uint8Array;
  width: number;
}

/** The answer: the packed bytes, or why it failed. */
export interface PackResponse {
  id: number;
  packed?: Uint8Array;
  error?: string;
}

/** The worker's global scope, typed without the worker lib (the rest of the program is not). */
const scope = self as unknown as {
  onmessage: ((e: MessageEvent<PackRequest>) => void) | null;
  postMessage(message: PackResponse, transfer?: Transferable[]): void;
};

scope.onmessage = (e) => {
  const { id, raw, width } = e.data;
  try {
    const packed = packBlock(raw, width);
    scope.postMessage({ id, packed }, [packed.buffer]);
  } catch (err) {
    scope.postMessage({ id, error: String(err) });
  }
};
