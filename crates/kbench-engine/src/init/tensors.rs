//! The tensors of a generated checkpoint, in order, with the shape each gets from the
//! config and how its values are made.

use super::*;

use crate::names::{self, draft, FfnNames, Int4, Proj};
use crate::shapes::{self, FfnShape, Matrix};
use crate::st::Dtype;

impl Gen {
    pub(super) fn head_jobs(&self) -> Vec<Job> {
        let s = &self.shapes;
        vec![
            Job {
                plan: plan(self.embed_name(), Dtype::BF16, s.embed().to_vec()),
                fill: Fill::Rand { std: 1.0 },
            },
            Job {
                plan: plan(
                    names::weight(&self.names().final_norm()),
                    Dtype::BF16,
                    vec![s.hidden],
                ),
                fill: Fill::Const(1.0),
            },
            Job {
                plan: plan(self.lm_name(), Dtype::BF16, s.lm_head().to_vec()),
                fill: Fill::Rand { std: self.lm_std() },
            },
        ]
    }

    pub(super) fn layer_jobs(&self, l: usize) -> Vec<Job> {
        let s = &self.shapes;
        let h = s.hidden;
        let gain = self.d.layer_gain;
        let ln = self.names().layer(l);
        let w = |module: String| names::weight(&module);
        let std_in = |n: usize| 1.0 / (n as f32).sqrt();
        // a linear drawn with std 1/sqrt(in), its output scaled by `out_gain`
        let linear = |module: String, m: Matrix, out_gain: f32| Job {
            plan: plan(w(module), Dtype::BF16, m.to_vec()),
            fill: Fill::Rand {
                std: out_gain * std_in(m[1]),
            },
        };
        let norm = |module: String, n: usize| Job {
            plan: plan(w(module), Dtype::BF16, vec![n]),
            fill: Fill::Const(1.0),
        };
        let ffn = |names: FfnNames, shape: FfnShape, jobs: &mut Vec<Job>| {
            jobs.push(linear(names.gate(), shape.proj(Proj::Gate), 1.0));
            jobs.push(linear(names.up(), shape.proj(Proj::Up), 1.0));
            jobs.push(linear(names.down(), shape.proj(Proj::Down), gain));
        };
        let mut jobs = vec![norm(ln.input_norm(), h)];
        match s.q_low_rank() {
            Some((a, b)) => {
                jobs.push(linear(ln.q_a(), a, 1.0));
                jobs.push(norm(ln.q_a_norm(), a[0]));
                jobs.push(linear(ln.q_b(), b, 1.0));
            }
            None => jobs.push(linear(ln.q(), s.q_full(), 1.0)),
        }
        jobs.push(linear(ln.kv_a(), s.kv_a(), 1.0));
        jobs.push(norm(ln.kv_a_norm(), s.kv_lora_rank));
        jobs.push(linear(ln.kv_b(), s.kv_b(), 1.0));
        jobs.push(linear(ln.o(), s.o(), gain));
        jobs.push(norm(ln.post_attention_norm(), h));
        if !self.arch.is_moe_layer(l as u32) {
            ffn(ln.dense_mlp(), s.dense, &mut jobs);
            return jobs;
        }
        let moe = s.moe.expect("generated configs have MoE dims");
        jobs.push(linear(ln.router(), moe.router(), 1.0));
        jobs.push(Job {
            plan: plan(ln.router_bias(), Dtype::F32, vec![moe.experts]),
            fill: Fill::Rand { std: 0.05 },
        });
        let scaling = self
            .arch
            .moe
            .as_ref()
            .map_or(1.0, |m| m.routed_scaling_factor as f32);
        for e in 0..moe.experts {
            let ep = ln.expert(e);
            for proj in [Proj::Gate, Proj::Up, Proj::Down] {
                let matrix = moe.expert.proj(proj);
                // routed outputs are scaled up by routed_scaling_factor: draw down smaller
                let std = match proj {
                    Proj::Down => gain * std_in(matrix[1]) / scaling,
                    _ => std_in(matrix[1]),
                };
                let base = ep.proj(proj);
                jobs.push(Job {
                    plan: plan(
                        Int4::packed(&base),
                        Dtype::I32,
                        shapes::int4_packed(matrix).to_vec(),
                    ),
                    fill: Fill::Int4Packed {
                        base: base.clone(),
                        matrix,
                        std,
                    },
                });
                jobs.push(Job {
                    plan: plan(
                        Int4::scale(&base),
                        Dtype::BF16,
                        shapes::int4_scales(matrix, s.group).to_vec(),
                    ),
                    fill: Fill::Int4Scale {
                        base: base.clone(),
                        matrix,
                        std,
                    },
                });
                jobs.push(Job {
                    plan: plan(Int4::shape(&base), Dtype::I32, vec![2]),
                    fill: Fill::Int4Shape { matrix },
                });
            }
        }
        if let Some(shared) = moe.shared {
            ffn(ln.shared_experts(), shared, &mut jobs);
        }
        jobs
    }

    pub(super) fn draft_jobs(&self) -> Vec<Job> {
        let s = &self.draft_shapes;
        let h = s.hidden;
        let std_in = |n: usize| 1.0 / (n as f32).sqrt();
        let bf = |name: &str, shape: Vec<usize>, fill: Fill| Job {
            plan: plan(name.into(), Dtype::BF16, shape),
            fill,
        };
        let w = |module: &str| names::weight(module);
        let [gate, up, down] = [Proj::Gate, Proj::Up, Proj::Down].map(|p| s.ffn.proj(p));
        vec![
            bf(
                &w(draft::FC),
                s.fc().to_vec(),
                Fill::Rand {
                    std: std_in(s.fc()[1]),
                },
            ),
            bf(&w(draft::INPUT_NORM), vec![h], Fill::Const(1.0)),
            bf(&w(draft::HIDDEN_NORM), vec![h], Fill::Const(1.0)),
            bf(&w(draft::Q), s.q().to_vec(), Fill::DraftAttn(AttnPart::Q)),
            bf(&w(draft::K), s.kv().to_vec(), Fill::DraftAttn(AttnPart::K)),
            bf(&w(draft::V), s.kv().to_vec(), Fill::DraftAttn(AttnPart::V)),
            bf(&w(draft::O), s.o().to_vec(), Fill::DraftAttn(AttnPart::O)),
            bf(&w(draft::POST_ATTENTION_NORM), vec![h], Fill::Const(1.0)),
            bf(
                &w(draft::GATE),
                gate.to_vec(),
                Fill::Rand { std: std_in(h) },
            ),
            bf(&w(draft::UP), up.to_vec(), Fill::Rand { std: std_in(h) }),
            bf(
                &w(draft::DOWN),
                down.to_vec(),
                Fill::Rand {
                    std: 0.05 * std_in(down[1]),
                },
            ),
            bf(&w(draft::FINAL_NORM), vec![h], Fill::Const(1.0)),
            Job {
                plan: plan(w(draft::LM_HEAD), Dtype::BF16, s.lm_head().to_vec()),
                fill: if self.quality > 0.0 {
                    Fill::DraftLmHead
                } else {
                    Fill::Rand { std: self.lm_std() }
                },
            },
            Job {
                plan: plan(draft::D2T.into(), Dtype::I64, vec![s.draft_vocab]),
                fill: Fill::D2t,
            },
            Job {
                plan: plan(draft::T2D.into(), Dtype::BOOL, vec![s.target_vocab]),
                fill: Fill::T2d,
            },
        ]
    }
}
