/**
 * kernels/unroll.ts, the `// @unroll` expander, on WGSL source strings (no GPU): bounds from
 * literals and consts, steps, nested loops, the loop variable in indices and arithmetic, and the
 * errors for forms it does not take; then every kernel's source as its wrapper builds it, and the
 * one matmul `Params` layout against its packer.
 */
import assert from "node:assert/strict";
import { evaluate, unrollLoops } from "../kernels/unroll.ts";
import { shaderCode, wgsl } from "../kernels/pipeline.ts";
import { MATMUL_PARAMS_LAYOUT, packMatmulParams } from "../kernels/matmul_common.ts";

/** Code without comments and with whitespace runs made one space, for comparing. */
const squash = (s: string) => s.replace(/\/\/[^\n]*/g, "").replace(/\s+/g, " ").trim();

Deno.test("unroll: a loop over a const bound becomes one block per trip", () => {
  const src = `const KMAX: u32 = 4u;
fn f(kr: ptr<function, array<vec4<f32>, KMAX>>, base: u32) {
  (*kr)[0] = k_at(base, 0u);
  // @unroll
  for (var y = 1u; y < KMAX; y++) {
    if (KSPAN > y) {
      (*kr)[y] = k_at(base, y * TPK + 1u);
    }
  }
}`;
  const out = unrollLoops(src);
  assert.equal(
    squash(out),
    squash(`const KMAX: u32 = 4u;
fn f(kr: ptr<function, array<vec4<f32>, KMAX>>, base: u32) {
  (*kr)[0] = k_at(base, 0u);
  { if (KSPAN > 1u) { (*kr)[1u] = k_at(base, 1u * TPK + 1u); } }
  { if (KSPAN > 2u) { (*kr)[2u] = k_at(base, 2u * TPK + 1u); } }
  { if (KSPAN > 3u) { (*kr)[3u] = k_at(base, 3u * TPK + 1u); } }
}`),
  );
  assert.match(out, /\/\/ unrolled: y = 1u \.\. 3u\n/);
  assert.doesNotMatch(out, /@unroll/);
});

Deno.test("unroll: bounds of literals, consts and const arithmetic; steps; <=", () => {
  const consts = `const MAX_KEYS: u32 = 64u;
const MP = 8u;
const TWICE = MP * 2u;
const HEX: u32 = 0x3u;
`;
  const trips = (loop: string) => {
    const out = unrollLoops(`${consts}// @unroll\n${loop} { s += i; }`);
    return [...out.matchAll(/s \+= (\(?-?\d+[iu]\)?);/g)].map((m) => m[1]);
  };
  assert.deepEqual(trips("for (var i = 1u; i < MAX_KEYS / MP; i++)"), [
    "1u",
    "2u",
    "3u",
    "4u",
    "5u",
    "6u",
    "7u",
  ]);
  assert.deepEqual(trips("for (var i = 4u; i < 16u; i += 4u)"), ["4u", "8u", "12u"]);
  assert.deepEqual(trips("for (var i = 0u; i <= HEX; i += 1u)"), ["0u", "1u", "2u", "3u"]);
  assert.deepEqual(trips("for (var i = TWICE - 2u; i < (TWICE + 4u) >> 1u; ++i)"), []);
  assert.deepEqual(trips("for (var i = MP; i < TWICE % 13u + 8u; i += MP / 4u)"), [
    "8u",
    "10u",
  ]);
  // i32 loops: by the annotation or an abstract start; negative values in parentheses.
  assert.deepEqual(trips("for (var i: i32 = -2; i < 1; i++)"), ["(-2i)", "(-1i)", "0i"]);
  assert.deepEqual(trips("for (var i = 0; i < 2; i++)"), ["0i", "1i"]);
  assert.deepEqual(trips("for (var i = 1i; i < 3i; i++)"), ["1i", "2i"]);
  // A loop with no trips leaves no block.
  assert.equal(squash(unrollLoops("// @unroll\nfor (var i = 2u; i < 2u; i++) { s += i; }")), "");
  assert.equal(evaluate("(1 + 2) * 3 - 4 / 2 % 3 << 1", new Map()), 14);
});

Deno.test("unroll: only the variable is substituted, and every copy has its own block", () => {
  const src = `// @unroll
for (var i = 0u; i < 2u; i++) {
  let v = x.i + idx[i] + i2 * i + f(i, vi);
  var t = v;
  acc[i] = t; // row i
}`;
  assert.equal(
    squash(unrollLoops(src)),
    squash(`{ let v = x.i + idx[0u] + i2 * 0u + f(0u, vi); var t = v; acc[0u] = t; }
{ let v = x.i + idx[1u] + i2 * 1u + f(1u, vi); var t = v; acc[1u] = t; }`),
  );
});

Deno.test("unroll: nested loops, the inner bound from the outer variable", () => {
  const src = `const R = 3u;
fn f() {
  // @unroll
  for (var i = 0u; i < R; i++) {
    // @unroll
    for (var j = i + 1u; j < R; j++) {
      m[i][j] = m[j][i] * f32(i + j);
    }
    for (var k = 0u; k < n; k++) { // not marked: stays a loop
      if (k > i) { break; }
    }
  }
}`;
  const out = unrollLoops(src);
  const inner = [
    ...out.matchAll(/m\[(\d)u\]\[(\d)u\] = m\[(\d)u\]\[(\d)u\] \* f32\((\d)u \+ (\d)u\)/g),
  ]
    .map((m) => m.slice(1).join(""));
  assert.deepEqual(inner, ["011001", "022002", "122112"]);
  assert.equal((out.match(/for \(var k = 0u; k < n; k\+\+\)/g) ?? []).length, 3);
  assert.equal((out.match(/if \(k > (\d)u\) \{ break; \}/g) ?? []).length, 3);
  // Unmarked loops and a marker that is not alone on its line are left as they are.
  const plain =
    "// loops marked // @unroll are expanded\nfor (var i = 0u; i < 2u; i++) { s += i; }";
  assert.equal(unrollLoops(plain), plain);
});

Deno.test("unroll: forms it does not take fail with the line and what to change", () => {
  const fails = (src: string, message: RegExp) =>
    assert.throws(() => unrollLoops(src, { label: "k.wgsl" }), message);
  fails(
    "fn f() {\n  // @unroll\n  let x = 1;\n}",
    /unroll: k\.wgsl:2: .* must be followed by a `for` loop/,
  );
  fails(
    "override N: u32 = 4u;\n// @unroll\nfor (var i = 0u; i < N; i++) {}",
    /k\.wgsl:2: bound `N`: `N` is not an integer literal or a module-scope const/,
  );
  fails("// @unroll\nfor (var i = 0u; i < p.n; i++) {}", /bound `p\.n`/);
  fails(
    "fn f() {\n  const N = 2u;\n  // @unroll\n  for (var i = 0u; i < N; i++) {}\n}",
    /k\.wgsl:3: bound `N`: `N` is not an integer literal or a module-scope const/,
  );
  fails("const A = B;\nconst B = A;\n// @unroll\nfor (var i = 0u; i < A; i++) {}", /itself/);
  fails("// @unroll\nfor (var i = 0u; i < 2.5; i++) {}", /bound `2\.5`/);
  fails("// @unroll\nfor (var i = 4u; i > 0u; i--) {}", /condition must be `i < END`/);
  fails("// @unroll\nfor (var i = 0u; j < 4u; i++) {}", /condition must be `i < END`/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i *= 2u) {}", /update must be `i\+\+`/);
  fails("// @unroll\nfor (let i = 0u; i < 4u; i++) {}", /init must be `var NAME = START`/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i += 0u) {}", /step must be >= 1/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { if (a) { break; } }", /`break` in the body/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { continue; }", /`continue` in the body/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { i += 1u; }", /assigns the loop variable/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { i++; }", /assigns the loop variable/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { let i = 2u; }", /declares `i` again/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) s += i;", /body must be a `\{ … \}` block/);
  fails("// @unroll\nfor (var i = 0u; i < 4u; i++) { s += i;", /unclosed loop body/);
  fails("// @unroll\nfor (var i = 0u; i < 1000u; i++) {}", /over 256 trips/);
  // break and continue of a loop or switch inside the body are fine.
  const ok =
    "// @unroll\nfor (var i = 0u; i < 2u; i++) { loop { break; } switch (i) { default: {} } }";
  assert.doesNotThrow(() => unrollLoops(ok));
});

/** Every kernel source with the prelude its wrapper prepends. */
const KERNELS: [string, string][] = [
  ["attention.wgsl", ""],
  [
    "attention_decode.wgsl",
    wgsl("rope_common.wgsl") + "alias KV = vec4<f32>;\n" +
    wgsl("attention_decode_common.wgsl"),
  ],
  ["attention_combine.wgsl", wgsl("attention_decode_common.wgsl")],
  ...["matmul.wgsl", "matmul_small.wgsl", "matmul_rows.wgsl", "matmul_naive.wgsl"].map(
    (f): [string, string] => [f, wgsl("matmul_common.wgsl")],
  ),
  ["matmul_reduce.wgsl", wgsl("matmul_common.wgsl")],
  ["sample.wgsl", wgsl("grammar_nomask.wgsl")],
  ["sample.wgsl", wgsl("grammar_mask.wgsl")],
  ["logits.wgsl", ""],
  ["rope_kv.wgsl", wgsl("rope_common.wgsl")],
];

Deno.test("unroll: every kernel expands, to constant indices where there were loops", () => {
  for (const [file, prelude] of KERNELS) {
    const loops = shaderCode(file, { prelude, unroll: false });
    const out = shaderCode(file, { prelude });
    assert.doesNotMatch(out, /^\s*\/\/\s*@unroll\s*$/m, `${file}: a marker left`);
    const marked = (loops.match(/^\s*\/\/\s*@unroll\s*$/gm) ?? []).length;
    assert.equal((out.match(/\/\/ unrolled: /g) ?? []).length >= marked, true, file);
  }
  // Decode attention's K registers: the ladder as written by hand before, indices constant.
  const decode = shaderCode("attention_decode.wgsl", { prelude: KERNELS[1][1] });
  for (let y = 1; y < 16; y++) {
    assert.ok(
      decode.includes(`if (KSPAN > ${y}u) {\n      (*kr)[${y}u] = k_at(base, ${y}u, kpart);`),
      `load_k rung ${y}`,
    );
  }
  assert.doesNotMatch(squash(decode), /\(\*kr\)\[y\]|\(\*vr\)\[i\]|acc\[r\]/);
  const small = shaderCode("matmul_small.wgsl", { prelude: wgsl("matmul_common.wgsl") });
  assert.ok(small.includes("(*acc)[7u] = mac((*acc)[7u], t, x_base(m0 + 7u) + i);"));
});

Deno.test("matmul Params: one struct in matmul_common.wgsl, packed field for field", () => {
  const struct = /struct Params \{([^}]*)\}/.exec(wgsl("matmul_common.wgsl"))![1];
  const fields = [...struct.replace(/\/\/[^\n]*/g, "").matchAll(/(\w+)\s*:\s*(\w+)/g)]
    .map((m) => [m[1], m[2]]);
  assert.deepEqual(fields, MATMUL_PARAMS_LAYOUT.map(([name, , type]) => [name, type]));
  for (
    const file of ["matmul.wgsl", "matmul_small.wgsl", "matmul_rows.wgsl", "matmul_naive.wgsl"]
  ) {
    assert.doesNotMatch(wgsl(file), /struct Params/, `${file} declares its own Params`);
  }
  const values = {
    m: 3,
    n: 5,
    k: 7,
    groupsX: 11,
    yStride: 13,
    yOffset: 17,
    flags: 2,
    eps: 1e-5,
    block: 19,
    kspan: 23,
    splits: 29,
  };
  const view = new DataView(packMatmulParams(values));
  assert.equal(view.byteLength, 48);
  MATMUL_PARAMS_LAYOUT.forEach(([name, key, type], i) => {
    const got = type === "f32" ? view.getFloat32(4 * i, true) : view.getUint32(4 * i, true);
    assert.equal(got, type === "f32" ? Math.fround(values[key]) : values[key], name);
  });
});
