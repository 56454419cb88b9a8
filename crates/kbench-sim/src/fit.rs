//! Nelder-Mead on a box (parameters mapped through a logistic so bounds always hold).
//! Small, dependency-free and deterministic: the same start gives the same path.

pub struct FitResult {
    pub x: Vec<f64>,
    /// `f` at `x`, as evaluated during the search.
    pub value: f64,
    pub evaluations: u32,
}

/// How small the simplex gets, in the unbounded coordinates (its first step is 1).
const X_TOLERANCE: f64 = 1e-3;

/// Minimises `f` over `lo <= x <= hi` from `x0`.
pub fn nelder_mead(
    f: &mut dyn FnMut(&[f64]) -> f64,
    x0: &[f64],
    lo: &[f64],
    hi: &[f64],
    max_evals: u32,
) -> FitResult {
    let n = x0.len();
    // Unconstrained z <-> bounded x through a logistic per coordinate.
    let to_x = |z: &[f64]| -> Vec<f64> {
        z.iter()
            .enumerate()
            .map(|(i, zi)| lo[i] + (hi[i] - lo[i]) / (1.0 + (-zi).exp()))
            .collect()
    };
    let to_z = |x: &[f64]| -> Vec<f64> {
        x.iter()
            .enumerate()
            .map(|(i, xi)| {
                // Start inside the box: at a bound the logistic is flat and the search would stall.
                let u = ((xi - lo[i]) / (hi[i] - lo[i])).clamp(0.02, 0.98);
                (u / (1.0 - u)).ln()
            })
            .collect()
    };
    let mut evals = 0u32;
    let mut eval = |z: &[f64], evals: &mut u32| {
        *evals += 1;
        let v = f(&to_x(z));
        if v.is_finite() {
            v
        } else {
            f64::MAX
        }
    };
    let z0 = to_z(x0);
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    let v0 = eval(&z0, &mut evals);
    simplex.push((z0.clone(), v0));
    for i in 0..n {
        let mut z = z0.clone();
        z[i] += 1.0;
        let v = eval(&z, &mut evals);
        simplex.push((z, v));
    }
    while evals < max_evals {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let spread = simplex[n].1 - simplex[0].1;
        // converged when the values agree to 1e-7 relatively, or the simplex has shrunk
        // to 1e-3 of its first step in every coordinate (a simulated objective moves in
        // whole nanoseconds, so a smaller simplex only walks a staircase)
        let width = simplex[1..]
            .iter()
            .flat_map(|s| s.0.iter().zip(&simplex[0].0).map(|(a, b)| (a - b).abs()))
            .fold(0.0f64, f64::max);
        if evals > 4 * n as u32
            && (spread.abs() <= 1e-10 + 1e-7 * simplex[0].1.abs() || width < X_TOLERANCE)
        {
            break;
        }
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|s| s.0[j]).sum::<f64>() / n as f64)
            .collect();
        let along = |t: f64| -> Vec<f64> {
            (0..n)
                .map(|j| centroid[j] + t * (simplex[n].0[j] - centroid[j]))
                .collect()
        };
        let zr = along(-1.0);
        let vr = eval(&zr, &mut evals);
        if vr < simplex[0].1 {
            let ze = along(-2.0);
            let ve = eval(&ze, &mut evals);
            simplex[n] = if ve < vr { (ze, ve) } else { (zr, vr) };
        } else if vr < simplex[n - 1].1 {
            simplex[n] = (zr, vr);
        } else {
            let zc = if vr < simplex[n].1 {
                along(-0.5)
            } else {
                along(0.5)
            };
            let vc = eval(&zc, &mut evals);
            if vc < simplex[n].1.min(vr) {
                simplex[n] = (zc, vc);
            } else {
                let best = simplex[0].0.clone();
                for s in simplex.iter_mut().skip(1) {
                    let z: Vec<f64> = (0..n).map(|j| best[j] + 0.5 * (s.0[j] - best[j])).collect();
                    let v = eval(&z, &mut evals);
                    *s = (z, v);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    FitResult {
        x: to_x(&simplex[0].0),
        value: simplex[0].1,
        evaluations: evals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_bounded_quadratic_minimum() {
        let mut f = |x: &[f64]| (x[0] - 3.0).powi(2) + (x[1] + 1.0).powi(2);
        let r = nelder_mead(&mut f, &[1.0, 1.0], &[0.0, -5.0], &[10.0, 5.0], 2000);
        assert!(
            (r.x[0] - 3.0).abs() < 1e-3 && (r.x[1] + 1.0).abs() < 1e-3,
            "{:?}",
            r.x
        );
    }
}
