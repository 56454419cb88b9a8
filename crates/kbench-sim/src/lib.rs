//! kbench-sim: cost model, serving simulator (virtual time), trace replay, calibration.
