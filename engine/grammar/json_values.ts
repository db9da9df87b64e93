/**
 * JSON containers as byte automata: objects with a fixed property order, maps, arrays with
 * positional items and count bounds, and any JSON value up to a nesting depth. Whitespace follows
 * engine/grammar/json_lex.ts: one bounded run after `{`, `[` and `,` and before `}` and `]`, an
 * optional space after `:`, nothing elsewhere.
 */
import {
  colonSpace,
  jsonBoolean,
  jsonNull,
  jsonNumber,
  jsonString,
  ws as wsRun,
} from "./json_lex.ts";
import { alt, empty, type Frag, literal, opt, seq, star } from "./nfa.ts";

/** How much whitespace a run may hold (json_lex.ts `MAX_INDENT`). */
export interface Layout {
  ws: Frag;
}

/** The default layout: runs of `""`, `" "` or a newline plus up to 20 spaces or tabs. */
export const DEFAULT_LAYOUT: Layout = { ws: wsRun() };

/** One property of a fixed object. */
export interface PropertyFrag {
  name: string;
  value: Frag;
  required: boolean;
}

/**
 * An object whose properties come in the given order, required ones always, optional ones
 * possibly left out; no other property is ever written (so keys never repeat).
 */
export function fixedObject(props: PropertyFrag[], layout: Layout): Frag {
  const { ws } = layout;
  const comma = seq(literal(","), ws);
  return (n, from) => {
    // first: no property written yet (no comma needed); more: at least one written
    let first: number | undefined = ws(n, literal("{")(n, from));
    let more: number | undefined;
    for (const p of props) {
      const entry = n.state();
      if (first !== undefined) n.epsilon(first, entry);
      if (more !== undefined) n.epsilon(comma(n, more), entry);
      const exit = seq(literal(JSON.stringify(p.name)), literal(":"), colonSpace, p.value)(
        n,
        entry,
      );
      if (p.required) {
        first = undefined;
        more = exit;
      } else if (more === undefined) more = exit;
      else {
        const both = n.state();
        n.epsilon(more, both);
        n.epsilon(exit, both);
        more = both;
      }
    }
    const close = n.state();
    if (first !== undefined) n.epsilon(first, close);
    if (more !== undefined) n.epsilon(ws(n, more), close);
    return literal("}")(n, close);
  };
}

/**
 * `open item ("," item)* close` or `open close`, with whitespace runs; `item` is placed once (a
 * loop), so nesting these stays linear in size.
 */
export function container(open: string, close: string, item: Frag, layout: Layout): Frag {
  const { ws } = layout;
  return (n, from) => {
    const opened = ws(n, literal(open)(n, from));
    const loop = n.state();
    n.epsilon(opened, loop);
    const after = item(n, loop);
    n.epsilon(seq(literal(","), ws)(n, after), loop);
    const end = n.state();
    n.epsilon(opened, end);
    n.epsilon(ws(n, after), end);
    return literal(close)(n, end);
  };
}

/** An object of any string keys whose values are `value` (keys may repeat; JSON keeps the last). */
export function mapObject(value: Frag, layout: Layout): Frag {
  return container("{", "}", seq(jsonString(), literal(":"), colonSpace, value), layout);
}

/** Options for {@linkcode boundedArray}. */
export interface ArrayShape {
  /** Schemas of the first items, in order. */
  prefix: Frag[];
  /** Items after the prefix (undefined: none). */
  rest?: Frag;
  minItems: number;
  /** undefined: no upper bound. */
  maxItems?: number;
}

/**
 * An array of `minItems` to `maxItems` items, item i from `prefix[i]` or `rest`. Items are
 * unrolled up to the larger of the bounds and the prefix; an unbounded tail loops.
 */
export function boundedArray(shape: ArrayShape, layout: Layout): Frag {
  const { ws } = layout;
  const { prefix, rest, minItems } = shape;
  const k = prefix.length;
  const maxItems = rest === undefined ? Math.min(shape.maxItems ?? k, k) : shape.maxItems;
  const emptyArray = seq(literal("["), ws, literal("]"));
  if (maxItems === 0) return emptyArray;
  if (k === 0 && minItems === 0 && maxItems === undefined) {
    return container("[", "]", rest!, layout);
  }
  const comma = seq(literal(","), ws);
  const unrolled = Math.max(k, minItems);
  const itemAt = (j: number) => j < k ? prefix[j] : rest!;
  // the items from j on, item j - 1 being written
  const tail = (j: number): Frag => {
    if (maxItems !== undefined && j >= maxItems) return empty;
    if (maxItems === undefined && j >= unrolled) return star(seq(comma, rest!));
    const more = seq(comma, itemAt(j), tail(j + 1));
    return j < minItems ? more : opt(more);
  };
  const filled = seq(literal("["), ws, itemAt(0), tail(1), ws, literal("]"));
  return minItems > 0 ? filled : alt(emptyArray, filled);
}

/**
 * Any JSON value with at most `depth` nested containers (`depth` 0: scalars only).
 */
export function anyValue(depth: number, layout: Layout): Frag {
  const scalars = [jsonString(), jsonNumber, jsonBoolean, jsonNull];
  if (depth <= 0) return alt(...scalars);
  const inner = anyValue(depth - 1, layout);
  return alt(mapObject(inner, layout), container("[", "]", inner, layout), ...scalars);
}

/** Any JSON object with at most `depth` nested containers, itself included. */
export function anyObject(depth: number, layout: Layout): Frag {
  return mapObject(anyValue(depth - 1, layout), layout);
}
