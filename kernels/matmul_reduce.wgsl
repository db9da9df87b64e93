// matmul_common.wgsl (prepended): WDTYPE, NORM, SWIGLU, Params, p, bias, y, cols, store_out.
// The second pass of split-K launches (matmul.wgsl's SPLIT, and every matmul_rows launch): one
// thread per output y[m, n] adds up the splits' partial products (the gate and up columns 2n,
// 2n + 1 with SWIGLU) and finishes as an unsplit kernel would (1 / rms from the splits' sums of
// x^2, bias, SiLU * up, residual add). Splits are summed in order, so the result does not depend
// on the launch. It reads no tile constant: one pipeline per dtype and fusion serves all.

// [splits][M][cols()] partial products, then [splits][M] partial sums of x^2 (NORM).
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * nwg.x + wid.x) * 256u + lid;
  if (i >= p.m * p.n) {
    return;
  }
  let m = i / p.n;
  let n = i % p.n;
  let c = select(n, 2u * n, SWIGLU);
  let stride = p.m * cols();
  var o = m * cols() + c;
  var a = 0.0;
  var b = 0.0;
  for (var s = 0u; s < p.splits; s++) {
    a += part[o];
    if (SWIGLU) {
      b += part[o + 1u];
    }
    o += stride;
  }
  if (NORM) {
    var ss = 0.0;
    var q = p.splits * stride + m;
    for (var s = 0u; s < p.splits; s++) {
      ss += part[q];
      q += p.m;
    }
    let r = inverseSqrt(ss / f32(p.k) + p.eps);
    a *= r;
    b *= r;
  }
  store_out(m, n, a, b);
}
