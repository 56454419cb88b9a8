//! compressed-tensors `pack-quantized` INT4 (symmetric, group-wise), as in Kimi-K2.5's
//! routed experts: `weight_packed` int32 `[out, in/8]` holding 8 values per word along the
//! input dimension (value `j` of word `k` is column `8k+j`, at bits `4j..4j+4`) stored with
//! an offset of +8; `weight_scale` BF16 `[out, in/group]`; `weight_shape` `[out, in]`.

use crate::bf16;

/// Packs signed values in [-8, 7], row-major with rows a multiple of 8 long, 8 per word.
pub fn pack(values: &[i8]) -> Vec<u32> {
    assert!(values.len() % 8 == 0, "INT4 values come 8 to a word");
    values
        .chunks_exact(8)
        .map(|word| {
            word.iter().enumerate().fold(0u32, |w, (j, &q)| {
                debug_assert!((-8..=7).contains(&q), "{q} is not an INT4 value");
                w | ((((q as i32) + 8) as u32 & 0xF) << (4 * j))
            })
        })
        .collect()
}

/// The signed value `j` (0..8) of a packed word.
#[inline(always)]
pub fn nibble(word: u32, j: usize) -> i8 {
    (((word >> (4 * j)) & 0xF) as i32 - 8) as i8
}

/// The signed value at `column` of a row's packed words.
#[inline(always)]
pub fn value_at(row: &[u32], column: usize) -> i8 {
    nibble(row[column / 8], column % 8)
}

/// Unpacks `out * inp` signed values in [-8, 7], row-major `[out, in]`.
pub fn unpack(packed: &[u32], out: usize, inp: usize) -> Vec<i8> {
    packed[..out * inp / 8]
        .iter()
        .flat_map(|&word| (0..8).map(move |j| nibble(word, j)))
        .collect()
}

/// Quantises a row-major `[out, in]` f32 matrix. Returns (packed words, BF16 scales).
pub fn quantize(w: &[f32], out: usize, inp: usize, group: usize) -> (Vec<u32>, Vec<u16>) {
    assert!(inp % group == 0 && group % 8 == 0 && w.len() == out * inp);
    let mut packed = vec![0u32; out * inp / 8];
    let mut scales = vec![0u16; out * inp / group];
    for r in 0..out {
        quantize_row_into(
            &w[r * inp..(r + 1) * inp],
            group,
            &mut packed[r * inp / 8..(r + 1) * inp / 8],
            &mut scales[r * inp / group..(r + 1) * inp / group],
        );
    }
    (packed, scales)
}

/// Quantises one row: scale = absmax / 7.5 per group (compressed-tensors' symmetric rule
/// for 4 bits), stored as bf16; values rounded against the stored scale and clamped to
/// [-8, 7].
pub fn quantize_row_into(row: &[f32], group: usize, packed: &mut [u32], scales: &mut [u16]) {
    for (g, chunk) in row.chunks_exact(group).enumerate() {
        let absmax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s_bits = bf16::from_f32(if absmax > 0.0 { absmax / 7.5 } else { 1.0 });
        scales[g] = s_bits;
        let s = bf16::to_f32(s_bits);
        for (k, word_vals) in chunk.chunks_exact(8).enumerate() {
            let mut word = 0u32;
            for (j, &x) in word_vals.iter().enumerate() {
                let q = (x / s).round().clamp(-8.0, 7.0) as i32;
                word |= (((q + 8) as u32) & 0xF) << (4 * j);
            }
            packed[(g * group) / 8 + k] = word;
        }
    }
}

/// Dequantises to f32 `[out, in]`.
pub fn dequantize(
    packed: &[u32],
    scales: &[u16],
    out: usize,
    inp: usize,
    group: usize,
) -> Vec<f32> {
    let mut w = Vec::with_capacity(out * inp);
    for r in 0..out {
        let row = &packed[r * inp / 8..(r + 1) * inp / 8];
        let row_scales = &scales[r * (inp / group)..(r + 1) * (inp / group)];
        w.extend((0..inp).map(|c| value_at(row, c) as f32 * bf16::to_f32(row_scales[c / group])));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_hold_columns_low_nibble_first_with_an_offset_of_eight() {
        let values: Vec<i8> = vec![-8, -1, 0, 1, 2, 3, 4, 7];
        let packed = pack(&values);
        assert_eq!(packed, vec![0xF_C_B_A_9_8_7_0]);
        assert_eq!(unpack(&packed, 1, 8), values);
        assert_eq!(value_at(&packed, 7), 7);
    }

    #[test]
    fn quantised_weights_come_back_within_a_step() {
        let (out, inp, group) = (3, 64, 32);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
            .collect();
        let (packed, scales) = quantize(&w, out, inp, group);
        let back = dequantize(&packed, &scales, out, inp, group);
        for (i, (&a, &b)) in w.iter().zip(&back).enumerate() {
            let s = bf16::to_f32(scales[(i / inp) * (inp / group) + (i % inp) / group]);
            // the top of the range is 7 steps, not 7.5: a group's absmax loses up to a step
            assert!((a - b).abs() <= s, "{i}: {a} vs {b}");
        }
    }
}
