//! Shared harness for cluster tests.
