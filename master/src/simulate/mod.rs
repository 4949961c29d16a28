//! Scenario simulator, trace mode and benchmark: drive the real allocator in simulated time.
