//! bfloat16 as stored in checkpoints and GPU buffers: the high half of an f32.

/// Rounds to nearest, ties to even; a NaN stays a (quiet) NaN.
pub fn from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

#[inline(always)]
pub fn to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// `x` as a bf16 store and load leave it.
pub fn round(x: f32) -> f32 {
    to_f32(from_f32(x))
}

pub fn vec_from(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|&x| from_f32(x)).collect()
}

pub fn vec_to(xs: &[u16]) -> Vec<f32> {
    xs.iter().map(|&x| to_f32(x)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even() {
        assert_eq!(from_f32(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and the next bf16: ties go to the even mantissa
        assert_eq!(from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(from_f32(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(from_f32(f32::INFINITY), 0x7f80);
        assert_eq!(from_f32(-0.0), 0x8000);
        assert!(to_f32(from_f32(f32::NAN)).is_nan());
        // the largest finite f32 rounds up to infinity, as the hardware's conversion does
        assert_eq!(from_f32(f32::MAX), 0x7f80);
        assert_eq!(round(3.0), 3.0);
    }
}
