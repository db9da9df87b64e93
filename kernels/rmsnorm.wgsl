// RMSNorm: out[i, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, with r = i, or r = rows[i]
// when GATHER (picks each sequence's last token before the LM head).
// One workgroup per output row: the threads stride over the columns, the sum of squares is
// reduced as a tree in workgroup memory (no subgroups on our targets), then every thread
// scales its columns.

override WG: u32 = 256u; // a power of two (the tree reduction halves it)
override GATHER: bool = false;

struct Params {
  count: u32, // output rows
  cols: u32,
  eps: f32,
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = wid.y * p.groups_x + wid.x;
  if (i >= p.count) {
    return; // uniform: depends on the workgroup id only
  }
  var r = i;
  if (GATHER) {
    r = rows[i];
  }
  let src = r * p.cols;
  let dst = i * p.cols;

  var ss = 0.0;
  for (var c = lid; c < p.cols; c += WG) {
    let v = x[src + c];
    ss += v * v;
  }
  red[lid] = ss;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red[lid] += red[lid + s];
    }
    workgroupBarrier();
  }
  let scale = inverseSqrt(red[0] / f32(p.cols) + p.eps);

  for (var c = lid; c < p.cols; c += WG) {
    out[dst + c] = x[src + c] * scale * weight[c];
  }
}
