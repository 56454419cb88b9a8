//! Inputs parsed once per process. One run builds many simulators (a sweep's variants, a
//! search's candidates, calibration's evaluations, a served simulator's sessions); each
//! reads the same presets, profiles and op tables, which are parsed the first time only.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

pub(crate) struct Memo<T>(OnceLock<Mutex<BTreeMap<String, T>>>);

impl<T: Clone> Memo<T> {
    pub(crate) const fn new() -> Memo<T> {
        Memo(OnceLock::new())
    }

    /// The value parsed under `key`, parsing it with `make` the first time. A failure is
    /// not kept: the next call reports it again (or succeeds, once the input is fixed).
    pub(crate) fn get_or_try<E>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let map = self.0.get_or_init(Default::default);
        if let Some(v) = map.lock().ok().and_then(|m| m.get(key).cloned()) {
            return Ok(v);
        }
        let v = make()?;
        if let Ok(mut m) = map.lock() {
            m.insert(key.to_string(), v.clone());
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_a_failure_is_not_kept() {
        static MEMO: Memo<u32> = Memo::new();
        let mut calls = 0;
        let mut get = |key: &str, ok: bool| {
            MEMO.get_or_try(key, || {
                calls += 1;
                if ok {
                    Ok(7)
                } else {
                    Err("bad")
                }
            })
        };
        assert_eq!(get("a", false), Err("bad"));
        assert_eq!(get("a", true), Ok(7));
        assert_eq!(get("a", false), Ok(7));
        assert_eq!(calls, 2);
    }
}
