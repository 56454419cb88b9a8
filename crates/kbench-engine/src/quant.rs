//! compressed-tensors `pack-quantized` INT4 (symmetric, group-wise), as in Kimi-K2.5's
//! routed experts: `weight_packed` int32 `[out, in/8]` holding 8 values per word along the
//! input dimension (value `j` of word `k` is column `8k+j`, at bits `4j..4j+4`) stored with
//! an offset of +8; `weight_scale` BF16 `[out, in/group]`; `weight_shape` `[out, in]`.

use crate::st::{bf16_to_f32, f32_to_bf16};

/// Quantises a row-major `[out, in]` f32 matrix. Returns (packed words, BF16 scales).
/// Scale = absmax / 7.5 per group (compressed-tensors' symmetric rule for 4 bits), values
/// rounded and clamped to [-8, 7].
pub fn quantize_int4(w: &[f32], out: usize, inp: usize, group: usize) -> (Vec<u32>, Vec<u16>) {
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

/// Quantises one row (used by the streaming model writer).
pub fn quantize_row_into(row: &[f32], group: usize, packed: &mut [u32], scales: &mut [u16]) {
    for (g, chunk) in row.chunks_exact(group).enumerate() {
        let absmax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s_bits = f32_to_bf16(if absmax > 0.0 { absmax / 7.5 } else { 1.0 });
        scales[g] = s_bits;
        let s = bf16_to_f32(s_bits);
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

/// Unpacks to signed int4 values in [-8, 7], row-major `[out, in]`.
pub fn unpack_int4(packed: &[u32], out: usize, inp: usize) -> Vec<i8> {
    let mut v = Vec::with_capacity(out * inp);
    for &word in &packed[..out * inp / 8] {
        for j in 0..8 {
            v.push((((word >> (4 * j)) & 0xF) as i32 - 8) as i8);
        }
    }
    v
}

/// Dequantises to f32 `[out, in]`.
pub fn dequantize_int4(
    packed: &[u32],
    scales: &[u16],
    out: usize,
    inp: usize,
    group: usize,
) -> Vec<f32> {
    let q = unpack_int4(packed, out, inp);
    q.iter()
        .enumerate()
        .map(|(i, &v)| {
            let (r, c) = (i / inp, i % inp);
            v as f32 * bf16_to_f32(scales[r * (inp / group) + c / group])
        })
        .collect()
}

/// Packs signed int4 values (row-major, `in` a multiple of 8) the way compressed-tensors does.
pub fn pack_int4(values: &[i8]) -> Vec<u32> {
    values
        .chunks_exact(8)
        .map(|c| {
            c.iter().enumerate().fold(0u32, |w, (j, &q)| {
                w | ((((q as i32) + 8) as u32 & 0xF) << (4 * j))
            })
        })
        .collect()
}
