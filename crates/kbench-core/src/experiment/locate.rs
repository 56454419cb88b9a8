//! Where a setting sits in an experiment file, for errors found after the file was parsed
//! (a preset name that does not exist is only known once presets are looked up).

use std::path::Path;

use super::error::{span_at, SourceSpan};

/// The span of the value at `dotted` (`hardware.preset`) in the TOML `text`, whether it was
/// written under a `[hardware]` header, as a dotted key or in an inline table.
pub fn value_span(text: &str, dotted: &str) -> Option<SourceSpan> {
    let root = toml::de::DeTable::parse(text).ok()?;
    let mut table = root.get_ref();
    let mut keys = dotted.split('.').peekable();
    while let Some(key) = keys.next() {
        let (_, value) = table.iter().find(|(k, _)| k.get_ref().as_ref() == key)?;
        if keys.peek().is_none() {
            return Some(span_at(text, value.span()));
        }
        match value.get_ref() {
            toml::de::DeValue::Table(t) => table = t,
            _ => return None,
        }
    }
    None
}

/// [`value_span`] in the file at `path`; `None` where it cannot be read or parsed.
pub fn locate(path: &Path, dotted: &str) -> Option<SourceSpan> {
    let text = crate::input::read_text(path).ok()?;
    value_span(&text, dotted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_values_under_headers_dotted_keys_and_inline_tables() {
        let text = "name = \"x\"\n[model]\npreset = \"kimi\"\n[hardware]\nprofile = \"a\"\n";
        let s = value_span(text, "model.preset").unwrap();
        assert_eq!(
            (s.line, s.column, s.snippet.as_str()),
            (3, 10, "preset = \"kimi\"")
        );
        let dotted = "model.preset = \"m\"\nhardware = { preset = \"h\" }\n";
        assert_eq!(value_span(dotted, "model.preset").unwrap().line, 1);
        let inline = value_span(dotted, "hardware.preset").unwrap();
        assert_eq!((inline.line, inline.column), (2, 23));
        assert!(value_span(text, "model.config").is_none());
        assert!(value_span(text, "name.preset").is_none());
    }
}
