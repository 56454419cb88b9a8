//! Acceptance traces, format v1 (docs/trace-format.md).
