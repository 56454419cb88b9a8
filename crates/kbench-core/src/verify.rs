//! Verification of a draft tree against target outputs: greedy, SGLang's target-only
//! tree sampling, and exact speculative sampling.
