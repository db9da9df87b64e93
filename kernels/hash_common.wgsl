// lowbias32 (Chris Wellons), a 32-bit integer hash: fingerprint.wgsl's projections and
// speculate.wgsl's n-gram pool keys (prepended by their wrappers). kernels/fingerprint.ts `mix`
// is the host's copy, for the references.
fn mix(v: u32) -> u32 {
  var h = v;
  h ^= h >> 16u;
  h *= 0x7feb352du;
  h ^= h >> 15u;
  h *= 0x846ca68bu;
  h ^= h >> 16u;
  return h;
}
