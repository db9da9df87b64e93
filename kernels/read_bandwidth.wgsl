// Read bandwidth probe: every invocation streams a grid-strided share of `src` in 16-byte loads
// (UNROLL independent loads in flight per step) and XORs them together; the result goes to
// `sink` so the loads cannot be optimised away. Bytes read = arrayLength(&src) * 16, exactly
// what a bandwidth-bound decode step does with its weights.

override WG: u32 = 256u;
override UNROLL: u32 = 4u; // 1, 2, 4 or 8

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let stride = nw.x * WG;
  let n = arrayLength(&src);
  var a0 = vec4<u32>(0u);
  var a1 = vec4<u32>(0u);
  var a2 = vec4<u32>(0u);
  var a3 = vec4<u32>(0u);
  var i = g.x;
  // Named accumulators rather than a loop over UNROLL: the loads stay independent and unrolled.
  loop {
    if (i + (UNROLL - 1u) * stride >= n) { break; }
    a0 ^= src[i];
    if (UNROLL >= 2u) { a1 ^= src[i + stride]; }
    if (UNROLL >= 4u) {
      a2 ^= src[i + 2u * stride];
      a3 ^= src[i + 3u * stride];
    }
    if (UNROLL >= 8u) {
      a0 ^= src[i + 4u * stride];
      a1 ^= src[i + 5u * stride];
      a2 ^= src[i + 6u * stride];
      a3 ^= src[i + 7u * stride];
    }
    i += UNROLL * stride;
  }
  // The tail (fewer than UNROLL strides left), one load at a time.
  loop {
    if (i >= n) { break; }
    a0 ^= src[i];
    i += stride;
  }
  sink[g.x] = a0 ^ a1 ^ a2 ^ a3;
}
