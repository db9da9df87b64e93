// kernels/sample.wgsl without grammar masks (no constrained row in the batch): nothing is bound
// and every token is allowed. grammar_mask.wgsl is the masking twin.

fn mask_setup(g: u32, seq: u32, j: u32) {}

fn mask_allows(t: u32) -> bool {
  return true;
}
