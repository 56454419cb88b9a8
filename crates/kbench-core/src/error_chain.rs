//! One line for an error and its sources, `error: cause: cause`, where a message must fit
//! in one field (a skipped search candidate, a GPU check's report). Errors never print their
//! source in their own message, so each cause appears once.

use std::fmt;

pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("loading the model")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read weights.safetensors")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn each_source_follows_once() {
        let err = Outer(Inner(std::io::Error::other("disk on fire")));
        assert_eq!(
            Chain(&err).to_string(),
            "loading the model: cannot read weights.safetensors: disk on fire"
        );
    }
}
