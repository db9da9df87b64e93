/**
 * Worker side of `Tokenizers` (engine/worker/tokenizers.ts): encodes long texts, renders long
 * chats and decodes long id lists off the server's thread, where a megabyte of prompt held every
 * other client for a second; and compiles constraints (engine/constraints.ts), which takes
 * milliseconds to a second.
 */
import { TextTokenizer } from "../model/tokenizer.ts";
import type { ModelFolder } from "../model/folder.ts";
import type { ChatMessage, ChatRenderOptions, ConstraintSpec } from "../../api/types.ts";
import { InvalidRequestError } from "../../api/errors.ts";
import { ConstraintCompiler } from "../constraints.ts";

/** What a tokenizer is built from (a model folder's tokenizer files and ids). */
export type TokenizerSource = Pick<ModelFolder, "tokenizerJson" | "tokenizerConfig" | "config">;

/** What a worker is asked to do. */
export type TokenizeWork =
  | { op: "encode"; text: string }
  | { op: "chat"; messages: ChatMessage[]; options: ChatRenderOptions }
  | { op: "decode"; ids: number[] }
  | { op: "grammar"; spec: ConstraintSpec; path?: string };

/** A request; the answer carries the same `id`. The first message is `init`. */
export type TokenizeRequest =
  | { op: "init"; source: TokenizerSource }
  | (TokenizeWork & { id: number });

/** The answer: ids, text or a compiled constraint, or the error's message. */
export interface TokenizeResponse {
  id: number;
  ids?: number[];
  text?: string;
  constraint?: { key: string; minTokens: number; image: Uint32Array };
  error?: string;
  /** The error was the request's (an InvalidRequestError): its param. */
  invalidParam?: string | null;
}

/** The worker's global scope, typed without the worker lib (the rest of the program is not). */
const scope = self as unknown as {
  onmessage: ((e: MessageEvent<TokenizeRequest>) => void) | null;
  postMessage(message: TokenizeResponse, transfer?: Transferable[]): void;
};

let tokenizer: TextTokenizer | undefined;
let compiler: ConstraintCompiler | undefined;
let vocabSize = 0;

scope.onmessage = (e) => {
  const m = e.data;
  if (m.op === "init") {
    tokenizer = TextTokenizer.load(m.source);
    vocabSize = m.source.config.vocabSize;
    return;
  }
  try {
    const t = tokenizer!;
    if (m.op === "encode") scope.postMessage({ id: m.id, ids: t.encode(m.text) });
    else if (m.op === "chat") {
      scope.postMessage({ id: m.id, ids: t.encodeChat(m.messages, m.options) });
    } else if (m.op === "grammar") {
      compiler ??= new ConstraintCompiler(t, vocabSize);
      // A copy: the compiler's cache keeps its image, the copy is moved to the other thread.
      const c = compiler.compile(m.spec, m.path);
      const image = c.image.slice();
      scope.postMessage({ id: m.id, constraint: { ...c, image } }, [image.buffer]);
    } else scope.postMessage({ id: m.id, text: t.decode(m.ids) });
  } catch (err) {
    scope.postMessage({
      id: m.id,
      error: err instanceof Error ? err.message : String(err),
      ...(err instanceof InvalidRequestError ? { invalidParam: err.param ?? null } : {}),
    });
  }
};
