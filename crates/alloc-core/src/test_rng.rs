//! The unit tests' random steps: xorshift64, the same sequence on every run.

/// A xorshift64 generator seeded with `x` (not 0).
pub(crate) fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
