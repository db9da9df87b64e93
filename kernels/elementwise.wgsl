// Elementwise f32 kernels, one invocation per output element:
//   silu_mul: out[m, j] = silu(gu[m, j]) * gu[m, F + j] (gate in columns [0, F), up in [F, 2F))
//   add:      out[i] = a[i] + b[i]
// The two entry points share the uniform at binding 0; each declares its own storage buffers
// in binding order, so the auto layouts stay dense (1, 2[, 3]).

override WG: u32 = 256u;

struct Params {
  rows: u32, // M (1 for add)
  cols: u32, // F for silu_mul, n for add
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> gate_up: array<f32>;
@group(0) @binding(2) var<storage, read_write> hidden: array<f32>;

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> sum: array<f32>;

fn flat_id(wid: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * p.groups_x + wid.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn silu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = flat_id(wid, lid);
  if (i >= p.rows * p.cols) {
    return;
  }
  let m = i / p.cols;
  let j = i - m * p.cols;
  let g = gate_up[2u * m * p.cols + j];
  let u = gate_up[(2u * m + 1u) * p.cols + j];
  // silu(g) = g * sigmoid(g); exp(-g) overflows to inf for g << 0, giving -0, the right limit.
  hidden[i] = g / (1.0 + exp(-g)) * u;
}

@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = flat_id(wid, lid);
  if (i >= p.cols) {
    return;
  }
  sum[i] = a[i] + b[i];
}
