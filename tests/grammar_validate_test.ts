/**
 * engine/grammar/validate.ts (the checker of generated JSON) on hand-picked values, and the
 * string formats: the automata of engine/grammar/formats.ts against the validator's calendar.
 */
import assert from "node:assert/strict";
import { formatValid, jsonEqual, validate } from "../engine/grammar/validate.ts";
import { FORMATS } from "../engine/grammar/formats.ts";
import { determinize, matches } from "../engine/grammar/dfa.ts";
import { Nfa } from "../engine/grammar/nfa.ts";
import { regexGrammar } from "../engine/grammar/regex.ts";
import { rng } from "../scripts/rng.ts";

const ok = (schema: unknown, value: unknown) =>
  assert.deepEqual(validate(schema, value), [], JSON.stringify(value));
const bad = (schema: unknown, value: unknown, why: RegExp) => {
  const errors = validate(schema, value);
  assert.ok(errors.some((e) => why.test(e)), `${JSON.stringify(value)}: ${errors.join("; ")}`);
};

Deno.test("validator: types, enum/const, objects, arrays, anyOf, $ref", () => {
  ok({ type: "integer" }, 3);
  bad({ type: "integer" }, 3.5, /not of type integer/);
  ok({ type: ["string", "null"] }, null);
  bad({ type: "number" }, "1", /not of type number/);
  ok({ enum: [{ a: 1, b: [2] }] }, { b: [2], a: 1 });
  bad({ const: [1, 2] }, [2, 1], /const/);
  const obj = {
    type: "object",
    properties: { a: { type: "string" } },
    required: ["a"],
    additionalProperties: false,
  };
  ok(obj, { a: "x" });
  bad(obj, {}, /missing required property "a"/);
  bad(obj, { a: "x", b: 1 }, /\$\.b: no value is allowed/);
  bad({ additionalProperties: { type: "integer" } }, { k: "v" }, /\$\.k/);
  const arr = {
    type: "array",
    prefixItems: [{ type: "string" }],
    items: { type: "integer" },
    minItems: 2,
    maxItems: 3,
  };
  ok(arr, ["a", 1, 2]);
  bad(arr, ["a"], /fewer than 2/);
  bad(arr, ["a", 1, 2, 3], /more than 3/);
  bad(arr, [1, 1], /\$\[0\]/);
  bad({ anyOf: [{ type: "string" }, { type: "null" }] }, 1, /anyOf/);
  const ref = { $defs: { p: { type: "integer" } }, properties: { x: { $ref: "#/$defs/p" } } };
  ok(ref, { x: 1 });
  bad(ref, { x: "1" }, /\$\.x/);
  bad({ $ref: "#/$defs/none" }, 1, /unresolved/);
  ok({ type: "string", minLength: 2, maxLength: 2 }, "🙂é");
  bad({ type: "string", maxLength: 1 }, "🙂é", /longer than 1/);
  bad({ type: "string", pattern: "^a+$" }, "ab", /does not match/);
  ok({ type: "string", pattern: "b" }, "abc"); // unanchored, as JSON Schema says
  assert.ok(jsonEqual({ a: [1, { b: null }] }, { a: [1, { b: null }] }));
  assert.ok(!jsonEqual({ a: 1 }, { a: 1, b: undefined }));
});

Deno.test("formats: hand-picked valid and invalid values", () => {
  const cases: [string, string[], string[]][] = [
    ["date", ["2024-02-29", "2000-02-29", "1999-12-31", "0000-01-01"], [
      "2023-02-29",
      "1900-02-29",
      "2024-04-31",
      "2024-13-01",
      "24-01-01",
    ]],
    ["time", ["23:59:59Z", "00:00:00.123+05:30"], [
      "24:00:00Z",
      "12:00:00",
      "12:60:00Z",
      "12:00:00z",
    ]],
    ["date-time", ["2024-02-29T12:00:00Z", "1970-01-01T00:00:00.5-01:00"], [
      "2024-02-29 12:00:00Z",
      "2023-02-29T12:00:00Z",
    ]],
    ["uuid", ["123e4567-e89b-12d3-a456-426614174000", "ABCDEFAB-CDEF-ABCD-EFAB-CDEFABCDEFAB"], [
      "123e4567e89b12d3a456426614174000",
      "g23e4567-e89b-12d3-a456-426614174000",
    ]],
    ["email", ["a@b.co", "first.last+tag@sub.example.org"], [
      "a@b",
      "a..b@c.de",
      "@b.co",
      "a@-b.co",
      "a@b-.co",
    ]],
    ["ipv4", ["0.0.0.0", "255.255.255.255", "10.1.20.199"], [
      "256.1.1.1",
      "01.1.1.1",
      "1.1.1",
      "1.1.1.1.1",
    ]],
  ];
  for (const [format, good, wrong] of cases) {
    for (const v of good) assert.ok(formatValid(format, v), `${format}: ${v}`);
    for (const v of wrong) assert.ok(!formatValid(format, v), `${format}: ${v} is not valid`);
  }
  assert.ok(!formatValid("hostname", "example.com"), "unsupported formats validate nothing");
});

Deno.test("date automaton = the calendar, for every day-like string of 1896–2104 and 1600/2000", () => {
  const n = new Nfa();
  const start = n.state();
  const d = determinize(n, { start, accept: regexGrammar(FORMATS.date, "date")(n, start) });
  const enc = new TextEncoder();
  const years = [1600, 1700, 2000, 2400, 9999, 0];
  for (let y = 1896; y <= 2104; y++) years.push(y);
  let valid = 0;
  for (const y of years) {
    for (let m = 0; m <= 13; m++) {
      for (let day = 0; day <= 32; day++) {
        const text = `${String(y).padStart(4, "0")}-${String(m).padStart(2, "0")}-${
          String(day).padStart(2, "0")
        }`;
        const real = formatValid("date", text);
        assert.equal(matches(d, enc.encode(text)), real, text);
        if (real) valid++;
      }
    }
  }
  assert.equal(
    valid,
    365 * years.length +
      years.filter((y) => y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0)).length,
  );
  // date-time and time: seeded random strings of the right shape
  const r = rng(9);
  const dt = (() => {
    const m = new Nfa();
    const s = m.state();
    return determinize(m, {
      start: s,
      accept: regexGrammar(FORMATS["date-time"], "date-time")(m, s),
    });
  })();
  for (let k = 0; k < 3000; k++) {
    const two = (hi: number) => String(r.int(hi)).padStart(2, "0");
    const text = `20${two(100)}-${two(14)}-${two(33)}T${two(26)}:${two(62)}:${two(62)}${
      ["Z", "+01:00", "-23:59", "+24:00", ""][r.int(5)]
    }`;
    assert.equal(matches(dt, enc.encode(text)), formatValid("date-time", text), text);
  }
});
