// Fingerprints of the hidden states that produced each token, for replays and the verification
// cross-check (docs/internals.md, "Fingerprints"): a 32-bit SimHash of the final residual row x
// (before the final norm): bit j is set when sum_i sign_j(i) * x[i] > 0, sign_j(i) = ±1 from bit j
// of a fixed integer hash of i. Signs of projections do not change with the row's scale and
// survive the last-ulp differences between batch compositions (a flip needs a projection within
// rounding of zero), while a different state flips about half of them.
//
// One workgroup per row: each thread sums its slice of the row into 32 projections, then the
// workgroup reduces them in a fixed order (bit-for-bit repeatable). The fingerprint goes to the
// fingerprint ring entry of the row's token (the token ring's layout: a sequence's row j at
// ring_offset + seq * ring_stride + j). A prefill (`prefill_row` set) fingerprints the one row
// whose index is in last_row (the chunk's last token) into `seq_base`'s entry.

struct Params {
  rows: u32, // rows to fingerprint (a prefill: 1)
  hidden: u32,
  rows_per_seq: u32, // a verification pass's R (else 1)
  ring_offset: u32,
  ring_stride: u32,
  seq_base: u32, // the first row's sequence (a prefill: its slot)
  prefill_row: u32, // 1: read the row last_row[0] holds
  _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>; // [rows, hidden]
@group(0) @binding(2) var<storage, read_write> fp_ring: array<u32>;
@group(0) @binding(3) var<storage, read> last_row: array<u32>; // [1]

const WG: u32 = 64u;
const BITS: u32 = 32u;
const NO_CHECK: u32 = 0xbf800000u; // kernels/cross_check.ts NO_CHECK

var<workgroup> part: array<array<f32, WG>, BITS>;

// mix: lowbias32, kernels/hash_common.wgsl (prepended by the wrapper); engine/runner's
// fingerprintRef uses the same.

@compute @workgroup_size(WG)
fn fingerprint(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let r = wid.x;
  if (r >= p.rows) {
    return;
  }
  let src = select(r, last_row[0], p.prefill_row != 0u);
  let base = src * p.hidden;
  var acc: array<f32, BITS>;
  for (var i = lid; i < p.hidden; i += WG) {
    let v = x[base + i];
    let h = mix(i + 0x9e3779b9u);
    // @unroll
    for (var j = 0u; j < 32u; j++) {
      acc[j] += select(-v, v, ((h >> j) & 1u) != 0u);
    }
  }
  // @unroll
  for (var j = 0u; j < 32u; j++) {
    part[j][lid] = acc[j];
  }
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      // @unroll
      for (var j = 0u; j < 32u; j++) {
        part[j][lid] += part[j][lid + s];
      }
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    var f = 0u;
    for (var j = 0u; j < 32u; j++) {
      f |= select(0u, 1u << j, part[j][0] > 0.0);
    }
    let seq = p.seq_base + r / p.rows_per_seq;
    let e = p.ring_offset + seq * p.ring_stride;
    fp_ring[e + r % p.rows_per_seq] = f;
    // A verification step's spare entry R holds its cross-check (cross_check.wgsl), if any.
    if (p.rows_per_seq > 1u && r % p.rows_per_seq == p.rows_per_seq - 1u) {
      fp_ring[e + p.rows_per_seq] = NO_CHECK;
    }
  }
}
