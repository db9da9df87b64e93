/**
 * Float64 references for every kernel family. Tests compare the GPU against these on seeded
 * random inputs. Inputs are plain number arrays (Float64Array); shapes are row-major.
 * Each family owns one section below; keep sections in this order.
 */

// ---- section: weights (dtype helpers) ----

// ---- section: linear (embedding, rmsnorm, matmul, elementwise) ----

// ---- section: attention (rope_kv, attention, attention_decode) ----

// ---- section: logits and sampling ----
