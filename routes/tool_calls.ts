/**
 * Tool calls out of generated text, streamed or not (the same code serves both, so a streamed
 * response adds up to the whole one).
 *
 * - Constrained output (`tool_choice` `required` or a named function) is the JSON of a call,
 *   `{"name": "f", "arguments": {...}}`, or an array of them: {@linkcode CallScanner} reads it as
 *   it arrives and passes the arguments on as the model writes them.
 * - With `tool_choice: "auto"` the output is a call when it is one of these, else text
 *   ({@linkcode splitToolCalls}): the whole output a call's JSON, or an array of them (as strata's
 *   preamble asks; Llama 3.1's `"parameters"` is taken for `"arguments"`); Hermes / Qwen2.5
 *   `<tool_call>{...}</tool_call>` blocks, with text around them; Mistral's
 *   `[TOOL_CALLS] [...]`. While the text may still become a call it is held back.
 */
import type { ChatToolCall } from "../api/types.ts";
import type { ToolMode } from "./tools.ts";

/** One piece of a tool call as it streams (OpenAI's `delta.tool_calls[i]`). */
export interface CallDelta {
  index: number;
  id?: string;
  type?: "function";
  function: { name?: string; arguments: string };
}

/** What a piece of output text gives: text to send as content, and call deltas. */
export interface OutputPiece {
  content: string;
  calls: CallDelta[];
}

/** Turns generated text into content and tool calls as it arrives. */
export interface ToolOutput {
  push(text: string): OutputPiece;
  /** After the last token: what was held back. */
  end(): OutputPiece;
}

/** A new tool call id. */
export function callId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

const isWs = (c: string) => c === " " || c === "\n" || c === "\t" || c === "\r";
/** A call's text up to its arguments, in the order the constraint writes it. */
const HEAD = /^\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*$/;
const SCALAR = /[-+0-9.eEa-z]/;

/**
 * Reads constrained calls (see the module doc): each call's id and name as soon as its name is
 * complete, then its arguments' text as it comes.
 */
export class CallScanner implements ToolOutput {
  #phase: "before" | "head" | "value" | "after" | "done" = "before";
  #head = "";
  #index = -1;
  #depth = 0;
  #kind: "container" | "string" | "scalar" = "container";
  #inString = false;
  #escape = false;

  /** @param array the output is an array of calls */
  constructor(readonly array: boolean) {}

  push(text: string): OutputPiece {
    const calls: CallDelta[] = [];
    let args = "";
    const flush = () => {
      if (args !== "") calls.push({ index: this.#index, function: { arguments: args } });
      args = "";
    };
    for (const ch of text) {
      if (this.#phase === "value") {
        if (this.#kind === "scalar" && !SCALAR.test(ch)) {
          flush();
          this.#phase = "after"; // ch is read below
        } else {
          args += ch;
          if (this.#valueEnds(ch)) {
            flush();
            this.#phase = "after";
          }
          continue;
        }
      }
      switch (this.#phase) {
        case "before":
          if (ch === "{") {
            this.#phase = "head";
            this.#head = ch;
          } else if (ch === "]") this.#phase = "done";
          break;
        case "head":
          if (isWs(ch) || !HEAD.test(this.#head)) {
            this.#head += ch;
            break;
          }
          this.#index++;
          calls.push({
            index: this.#index,
            id: callId(),
            type: "function",
            function: { name: JSON.parse(HEAD.exec(this.#head)![1]), arguments: "" },
          });
          this.#phase = "value";
          this.#startValue(ch);
          args += ch;
          break;
        case "after":
          if (ch === "}") this.#phase = this.array ? "before" : "done";
          break;
      }
    }
    flush();
    return { content: "", calls };
  }

  end(): OutputPiece {
    return { content: "", calls: [] };
  }

  #startValue(ch: string): void {
    this.#inString = false;
    this.#escape = false;
    if (ch === "{" || ch === "[") {
      this.#kind = "container";
      this.#depth = 1;
    } else if (ch === '"') {
      this.#kind = "string";
      this.#inString = true;
    } else this.#kind = "scalar";
  }

  /** Whether `ch`, the value's latest character, completes it. */
  #valueEnds(ch: string): boolean {
    if (this.#inString) {
      if (this.#escape) this.#escape = false;
      else if (ch === "\\") this.#escape = true;
      else if (ch === '"') {
        this.#inString = false;
        return this.#kind === "string";
      }
      return false;
    }
    if (this.#kind !== "container") return false;
    if (ch === '"') this.#inString = true;
    else if (ch === "{" || ch === "[") this.#depth++;
    else if (ch === "}" || ch === "]") return --this.#depth === 0;
    return false;
  }
}

/** A call found in text: the function's name and its arguments as JSON text. */
export interface FoundCall {
  name: string;
  arguments: string;
}

function json(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** `v` as calls of the named functions (an object, or a non-empty array when `list`), or null. */
function callsOf(v: unknown, names: readonly string[], list: boolean): FoundCall[] | null {
  if (Array.isArray(v)) {
    if (!list || v.length === 0) return null;
    const all = v.map((x) => callsOf(x, names, false));
    return all.every((c) => c !== null) ? all.flat() as FoundCall[] : null;
  }
  if (v === null || typeof v !== "object") return null;
  const o = v as Record<string, unknown>;
  if (typeof o.name !== "string" || !names.includes(o.name)) return null;
  let args: unknown = o.arguments ?? o.parameters ?? {};
  if (typeof args === "string") args = json(args);
  if (args === null || typeof args !== "object" || Array.isArray(args)) return null;
  return [{ name: o.name, arguments: JSON.stringify(args) }];
}

const MARKERS = ["<tool_call>", "[TOOL_CALLS]"];
const TAGGED = /<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g;

/**
 * The calls in a complete `auto` output (see the module doc), with the text around them as
 * content (null when there is none); null when the output is not a call.
 */
export function splitToolCalls(
  text: string,
  names: readonly string[],
): { content: string | null; calls: FoundCall[] } | null {
  const whole = callsOf(json(text.trim()), names, true);
  if (whole) return { content: null, calls: whole };
  const marker = MARKERS.map((m) => text.indexOf(m)).filter((i) => i >= 0);
  if (marker.length === 0) return null;
  const at = Math.min(...marker);
  const before = text.slice(0, at).trimEnd();
  let calls: FoundCall[] | null, after = "";
  if (text.startsWith("[TOOL_CALLS]", at)) {
    calls = callsOf(json(text.slice(at + 12).trim()), names, true);
  } else {
    const found = [...text.slice(at).matchAll(TAGGED)]
      .map((m) => callsOf(json(m[1].trim()), names, false));
    calls = found.every((c) => c !== null) ? found.flat() as FoundCall[] : null;
    after = text.slice(at).replace(TAGGED, "").trim();
  }
  if (!calls) return null;
  const content = before + (after === "" ? "" : (before === "" ? "" : "\n") + after);
  return { content: content === "" ? null : content, calls };
}

/** The longest end of `text` that is the start of a marker (it may become one). */
function partialMarker(text: string): number {
  let best = 0;
  for (const m of MARKERS) {
    for (let n = Math.min(m.length - 1, text.length); n > best; n--) {
      if (text.endsWith(m.slice(0, n))) best = n;
    }
  }
  return best;
}

/**
 * `auto` output: text streams on except what may still become a call (a start of `{` or `[`,
 * anything from a marker on, whitespace before it); at the end the held text is parsed.
 */
export class AutoCalls implements ToolOutput {
  #all = "";
  #sent = 0;

  constructor(readonly names: readonly string[]) {}

  push(text: string): OutputPiece {
    this.#all += text;
    const end = this.#safeEnd();
    const content = this.#all.slice(this.#sent, end);
    this.#sent = Math.max(this.#sent, end);
    return { content, calls: [] };
  }

  end(): OutputPiece {
    const found = splitToolCalls(this.#all, this.names);
    if (!found) {
      const content = this.#all.slice(this.#sent);
      this.#sent = this.#all.length;
      return { content, calls: [] };
    }
    const content = (found.content ?? "").slice(this.#sent);
    const calls = found.calls.flatMap((c, index): CallDelta[] => [
      { index, id: callId(), type: "function", function: { name: c.name, arguments: "" } },
      { index, function: { arguments: c.arguments } },
    ]);
    return { content, calls };
  }

  /** How much of the text may be sent. */
  #safeEnd(): number {
    const all = this.#all;
    const lead = all.length - all.trimStart().length;
    if (lead === all.length) return this.#sent;
    if (this.#sent === 0 && (all[lead] === "{" || all[lead] === "[")) return 0;
    const marker = MARKERS.map((m) => all.indexOf(m)).filter((i) => i >= 0);
    const end = marker.length > 0 ? Math.min(...marker) : all.length - partialMarker(all);
    return Math.max(this.#sent, all.slice(0, end).trimEnd().length);
  }
}

/** Plain text: everything is content. */
class PlainText implements ToolOutput {
  push(text: string): OutputPiece {
    return { content: text, calls: [] };
  }
  end(): OutputPiece {
    return { content: "", calls: [] };
  }
}

/** The reader of one choice's output for a request's tool mode. */
export function toolOutput(mode: ToolMode, names: readonly string[], array: boolean): ToolOutput {
  if (mode === "constrained") return new CallScanner(array);
  if (mode === "auto") return new AutoCalls(names);
  return new PlainText();
}

/** Adds a delta to the calls it belongs to (as the openai clients accumulate them). */
export function addDelta(calls: ChatToolCall[], d: CallDelta): void {
  const c = calls[d.index] ??= {
    id: d.id ?? "",
    type: "function",
    function: { name: d.function.name ?? "", arguments: "" },
  };
  c.function.arguments += d.function.arguments;
}

/** A whole output read at once: its content (null when only calls) and calls. */
export function readOutput(
  out: ToolOutput,
  text: string,
): { content: string | null; calls: ChatToolCall[] } {
  const calls: ChatToolCall[] = [];
  let content = "";
  for (const piece of [out.push(text), out.end()]) {
    content += piece.content;
    for (const d of piece.calls) addDelta(calls, d);
  }
  return { content: calls.length > 0 && content === "" ? null : content, calls };
}
