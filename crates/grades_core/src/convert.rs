//! Half-precision embeddings widened to the f32 the core computes in.
//!
//! Embeddings stored as float16 (half the bytes on disk) are widened once,
//! straight into the caller's f32 matrix, with the CPU's conversion
//! instructions where it has them (`half` picks them at run time).

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use crate::error::Error;

/// Widen IEEE binary16 values, given as their bits, into `dst` (same length).
pub fn widen_f16(src: &[u16], dst: &mut [f32]) -> crate::Result<()> {
    if src.len() != dst.len() {
        return Err(Error::Invalid(format!(
            "float16 values: {} values for {} places in the output",
            src.len(),
            dst.len()
        )));
    }
    src.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every bit pattern widens to the value `half` gives it one at a time
        /// (NaN to a NaN): the bulk path agrees with the scalar one.
        #[test]
        fn widening_is_exact(bits in proptest::collection::vec(any::<u16>(), 0..300)) {
            let mut out = vec![0.0f32; bits.len()];
            widen_f16(&bits, &mut out).unwrap();
            for (b, y) in bits.iter().zip(&out) {
                let x = half::f16::from_bits(*b).to_f32();
                prop_assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
            }
        }
    }

    #[test]
    fn lengths_must_match() {
        let mut out = vec![0.0f32; 3];
        assert!(widen_f16(&[0, 1], &mut out).is_err());
    }
}
