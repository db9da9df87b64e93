// Flash-decoding's merge for split decode attention (kernels/attention_decode.wgsl's header):
// a workgroup per (q head, slot) loads every split's partial (m, l, acc) at once, one or a few
// loads per thread and no serial chain, and writes
//   out = sum_c acc_c 2^(m_c - M) / sum_c l_c 2^(m_c - M),
// zeros for a slot with seq_len 0. Straight-line code throughout: the loops over splits and
// split groups are unrolled (`// @unroll`; a loop trip costs ~30 ns on an H200, docs/kernels.md).
// attention_decode_common.wgsl (prepended, after attention_mask.wgsl): WG, HD, D4, KEYS, CG,
// CWG, CMAX, NEG, Params, p, seq_len, dst, head_row, decode_span.

@group(0) @binding(9) var<storage, read> partials: array<vec4<f32>>; // `main`'s partials

var<workgroup> cm: array<vec4<f32>, CWG / 4u>; // m per split (-inf past n)
var<workgroup> cw: array<f32, CWG>; // w per split
var<workgroup> cl: array<vec4<f32>, CWG / 4u>; // w l per split
var<workgroup> cred: array<vec4<f32>, CWG>; // [cg][d4] partial sums

// Split c's accumulator at element d4, or zero when c holds no keys (c >= n).
fn part_acc(base: u32, c: u32, d4: u32, n: u32) -> vec4<f32> {
  if (c >= n) {
    return vec4<f32>(0.0);
  }
  return partials[(base + c) * D4 + d4];
}

// Split c's weighted accumulator a w_c; zero when c holds no keys (its `a` may be stale).
fn weighted(a: vec4<f32>, c: u32, n: u32) -> vec4<f32> {
  if (c >= n) {
    return vec4<f32>(0.0);
  }
  return a * cw[c];
}

// Group g's share of the output at element d4 (zero past CG).
fn group_sum(g: u32, d4: u32) -> vec4<f32> {
  if (g >= CG) {
    return vec4<f32>(0.0);
  }
  return cred[g * D4 + d4];
}

@compute @workgroup_size(CWG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let s = wid.y;
  let base = (s * p.n_heads + h) * p.n_split;
  let cg = lid / D4;
  let d4 = lid % D4;

  // Every load up front, not waiting for seq_len: (m, l) of split lid, and acc of splits cg,
  // cg + CG, ... at element d4 (guarded by n_split here; splits at or past n are zeroed below).
  var ml = vec2<f32>(NEG, 0.0);
  if (lid < p.n_split) {
    ml = partials[p.seqs * p.n_heads * p.n_split * D4 + base + lid].xy;
  }
  let ok = cg < CG;
  var a: array<vec4<f32>, CMAX>;
  a[0] = part_acc(base, cg, d4, select(0u, p.n_split, ok));
  // @unroll
  for (var c = 1u; c < CMAX; c++) {
    a[c] = part_acc(base, cg + c * CG, d4, select(0u, p.n_split, ok));
  }

  let len = seq_len[s];
  let chunks = decode_span(len).z; // the chunks `main` divided over the splits
  let per = max(1u, (chunks + p.n_split - 1u) / p.n_split);
  let n = (chunks + per - 1u) / per; // splits that hold keys, as `main` divided them
  cm[lid / 4u][lid % 4u] = select(NEG, ml.x, lid < n);
  workgroupBarrier();

  // Weights 2^(m_c - M), 0 past n: the max over all CWG = 64 entries, 16 vec4 reads.
  var m4 = max(max(max(cm[0], cm[1]), max(cm[2], cm[3])),
    max(max(cm[4], cm[5]), max(cm[6], cm[7])));
  m4 = max(m4, max(max(max(cm[8], cm[9]), max(cm[10], cm[11])),
    max(max(cm[12], cm[13]), max(cm[14], cm[15]))));
  let mx = max(max(m4.x, m4.y), max(m4.z, m4.w));
  let w = select(0.0, exp2(ml.x - mx), lid < n);
  cw[lid] = w;
  cl[lid / 4u][lid % 4u] = select(0.0, w * ml.y, lid < n);
  workgroupBarrier();

  // One expression, not a chain of `+=`: Mesa's GL compiler contracts the two differently.
  let o = weighted(a[0], cg, n) + weighted(a[1], cg + CG, n) + weighted(a[2], cg + 2u * CG, n) +
    weighted(a[3], cg + 3u * CG, n) + weighted(a[4], cg + 4u * CG, n) +
    weighted(a[5], cg + 5u * CG, n) + weighted(a[6], cg + 6u * CG, n) +
    weighted(a[7], cg + 7u * CG, n) + weighted(a[8], cg + 8u * CG, n) +
    weighted(a[9], cg + 9u * CG, n) + weighted(a[10], cg + 10u * CG, n) +
    weighted(a[11], cg + 11u * CG, n) + weighted(a[12], cg + 12u * CG, n) +
    weighted(a[13], cg + 13u * CG, n) + weighted(a[14], cg + 14u * CG, n) +
    weighted(a[15], cg + 15u * CG, n);
  if (ok) {
    cred[lid] = o;
  }
  workgroupBarrier();

  if (lid < D4) {
    var t = group_sum(0u, lid) + group_sum(1u, lid) + group_sum(2u, lid) + group_sum(3u, lid);
    // @unroll
    for (var g = 4u; g < 16u; g += 4u) {
      if (CG > g) {
        t += group_sum(g, lid) + group_sum(g + 1u, lid) + group_sum(g + 2u, lid) +
          group_sum(g + 3u, lid);
      }
    }
    for (var g = 16u; g < CG; g++) { // tiny head dims only (HD < 64)
      t += cred[g * D4 + lid];
    }
    // l = sum over the splits of w l: 16 vec4 reads.
    var l4 = (cl[0] + cl[1] + cl[2] + cl[3]) + (cl[4] + cl[5] + cl[6] + cl[7]);
    l4 += (cl[8] + cl[9] + cl[10] + cl[11]) + (cl[12] + cl[13] + cl[14] + cl[15]);
    let l = l4.x + l4.y + l4.z + l4.w;
    dst[head_row(s, h) + lid] = select(vec4<f32>(0.0), t / l, n > 0u);
  }
}