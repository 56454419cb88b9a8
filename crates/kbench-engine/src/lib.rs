//! kbench-engine: the native engine.
