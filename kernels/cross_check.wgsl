// The verification cross-check (docs/speculation.md): on a sampled step, the plain decode path
// runs for every slot's row 0 before the verification pass, over the same inputs (the token at
// position L, keys 0..L). `check_keep` keeps its final residual rows x[s] (before the final norm,
// what fingerprints read); after the verification pass, `check_compare` compares slot s's row 0,
// x[s * R], with it: rel = ||h_verify - h_plain|| / mean(||h_verify||, ||h_plain||), written as
// f32 bits into the fingerprint ring's spare entry of the step (entry R after the slot's R rows),
// read back with the tokens. A done slot gets NO_CHECK, as every entry R of an unchecked
// verification step does (fingerprint.wgsl).
//
// One workgroup per slot; the three sums reduce through workgroup memory in a fixed order.

struct Params {
  slots: u32,
  hidden: u32,
  rows_per_seq: u32, // R of the verification pass
  ring_offset: u32, // entry of this step's row in the fingerprint ring
  ring_stride: u32,
  _pad0: u32,
  _pad1: u32,
  _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>; // [rows, hidden] final residual rows
@group(0) @binding(2) var<storage, read_write> plain: array<f32>; // [slots, hidden]
@group(0) @binding(3) var<storage, read> slot_state: array<vec4<u32>>; // [S]
@group(0) @binding(4) var<storage, read_write> fp_ring: array<u32>;

const WG: u32 = 64u;
// -1.0f: no cross-check (a relative distance is never negative, and this is not a NaN).
const NO_CHECK: u32 = 0xbf800000u;

var<workgroup> sums: array<vec4<f32>, WG>;

@compute @workgroup_size(WG)
fn check_keep(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let s = wid.x;
  if (s >= p.slots) {
    return;
  }
  for (var i = lid; i < p.hidden; i += WG) {
    plain[s * p.hidden + i] = x[s * p.hidden + i];
  }
}

@compute @workgroup_size(WG)
fn check_compare(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let s = wid.x;
  if (s >= p.slots) {
    return;
  }
  let v0 = s * p.rows_per_seq * p.hidden;
  let p0 = s * p.hidden;
  var acc = vec4<f32>(0.0);
  for (var i = lid; i < p.hidden; i += WG) {
    let v = x[v0 + i];
    let h = plain[p0 + i];
    acc += vec4<f32>((v - h) * (v - h), v * v, h * h, 0.0);
  }
  sums[lid] = acc;
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    workgroupBarrier();
    if (lid < k) {
      sums[lid] += sums[lid + k];
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    let t = sums[0];
    let mean = 0.5 * (sqrt(t.y) + sqrt(t.z));
    let rel = sqrt(t.x) / max(mean, 1e-30);
    let out = p.ring_offset + s * p.ring_stride + p.rows_per_seq;
    fp_ring[out] = select(bitcast<u32>(rel), NO_CHECK, slot_state[s].x != 0u);
  }
}
