/**
 * Worker side of `Deflater` (engine/session_store.ts): deflates session snapshot blocks
 * off the main thread. fflate's level 1 takes tens of milliseconds per TinyLlama-size block (720
 * kB of f32 K and V), time the event loop would not stream tokens in.
 */
import { deflateSync } from "fflate";

/** A request: deflate `raw`, answer with the same `id`. */
export interface DeflateRequest {
  id: number;
  raw: Uint8Array;
}

/** The answer: the deflated bytes, or why it failed. */
export interface DeflateResponse {
  id: number;
  packed?: Uint8Array;
  error?: string;
}

/** The worker's global scope, typed without the worker lib (the rest of the program is not). */
const scope = self as unknown as {
  onmessage: ((e: MessageEvent<DeflateRequest>) => void) | null;
  postMessage(message: DeflateResponse, transfer?: Transferable[]): void;
};

scope.onmessage = (e) => {
  const { id, raw } = e.data;
  try {
    const packed = deflateSync(raw, { level: 1 });
    scope.postMessage({ id, packed }, [packed.buffer]);
  } catch (err) {
    scope.postMessage({ id, error: String(err) });
  }
};
