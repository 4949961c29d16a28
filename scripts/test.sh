#!/usr/bin/env bash
# The test command: installs what is missing, then format, lint, build and every test
# (unit, property, simulator scenarios, real etcd, real cgroups, clusters over real QUIC).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Cluster tests run the real binaries: build them first.
cargo build --workspace --bins
cargo test --workspace
