//! SGLang's draft tree: beam expansion by cumulative probability and final selection.
