#!/usr/bin/env bash
# The test command: installs what is missing, then format, lint, docs, the dependency policy,
# build and every test (unit, property, simulator scenarios, real etcd, real cgroups, clusters
# over real QUIC).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Every crate's docs build without a warning (broken intra-doc links, missing docs where the
# crate requires them).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
# The dependency policy (deny.toml): allowed licenses, and banned crates (aws-lc-rs, openssl...).
# Offline: cargo-deny's advisory database cannot be fetched here, so only bans and licenses.
# It reads every crate of the lock file, those of other platforms too, which a build on this
# one never downloads: fetch them first (a fresh machine has none of them).
cargo fetch --locked --quiet
PATH="$PATH:$HOME/.local/bin" cargo deny --offline check bans licenses
# What the crate graph promises (README "Layout"): the protocol crate does no I/O, and what
# framework authors compile has no certificate authority.
if cargo tree -p gantry-proto -e normal | grep -E ' (tokio|quinn) v'; then
  echo "gantry-proto must not depend on tokio or quinn" >&2
  exit 1
fi
if cargo tree -p gantry-sdk -e normal | grep -E ' rcgen v'; then
  echo "gantry-sdk must not depend on rcgen (certificate issuing is gantry-pki's)" >&2
  exit 1
fi
if cargo tree -p gantry-master -e normal | grep -E ' gantry-sdk v'; then
  echo "gantry-master must not depend on gantry-sdk (it uses gantry-proto, gantry-transport, gantry-placement and gantry-cli directly)" >&2
  exit 1
fi
if cargo tree -p gantry-agent -e normal | grep -E ' gantry-sdk v'; then
  echo "gantry-agent must not depend on gantry-sdk (it uses gantry-proto, gantry-transport, gantry-placement and gantry-cli directly)" >&2
  exit 1
fi
# Cluster tests run the real binaries: build them first.
cargo build --workspace --bins
cargo test --workspace
# The dashboard test's screenshot (tests/tests/dashboard.rs, headless Chromium).
if [ -f target/tmp/dashboard.png ]; then
  echo "dashboard screenshot: $PWD/target/tmp/dashboard.png"
fi
