/**
 * Worker side of `Tokenizers` (engine/worker/tokenizers.ts): encodes long texts, renders long
 * chats and decodes long id lists off the server's thread, where a megabyte of prompt held every
 * other client for a second.
 */
import { type ChatMessage, TextTokenizer } from "../model/tokenizer.ts";
import type { ModelFolder } from "../model/folder.ts";

/** What a tokenizer is built from (a model folder's tokenizer files and ids). */
export type TokenizerSource = Pick<ModelFolder, "tokenizerJson" | "tokenizerConfig" | "config">;

/** What a worker is asked to do. */
export type TokenizeWork =
  | { op: "encode"; text: string }
  | { op: "chat"; messages: ChatMessage[] }
  | { op: "decode"; ids: number[] };

/** A request; the answer carries the same `id`. The first message is `init`. */
export type TokenizeRequest =
  | { op: "init"; source: TokenizerSource }
  | (TokenizeWork & { id: number });

/** The answer: ids or text, or the error's message. */
export interface TokenizeResponse {
  id: number;
  ids?: number[];
  text?: string;
  error?: string;
}

/** The worker's global scope, typed without the worker lib (the rest of the program is not). */
const scope = self as unknown as {
  onmessage: ((e: MessageEvent<TokenizeRequest>) => void) | null;
  postMessage(message: TokenizeResponse): void;
};

let tokenizer: TextTokenizer | undefined;

scope.onmessage = (e) => {
  const m = e.data;
  if (m.op === "init") {
    tokenizer = TextTokenizer.load(m.source);
    return;
  }
  try {
    const t = tokenizer!;
    if (m.op === "encode") scope.postMessage({ id: m.id, ids: t.encode(m.text) });
    else if (m.op === "chat") scope.postMessage({ id: m.id, ids: t.encodeChat(m.messages) });
    else scope.postMessage({ id: m.id, text: t.decode(m.ids) });
  } catch (err) {
    scope.postMessage({ id: m.id, error: err instanceof Error ? err.message : String(err) });
  }
};
