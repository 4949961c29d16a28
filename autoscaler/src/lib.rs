//! # gantry-autoscaler
//!
//! An elastic, cost-aware fleet (issue 31): node pools with prices, scale-up from the demand the
//! fleet cannot place, scale-down of idle nodes, spot notices, cost per pool. It runs as its own
//! component (`gantry-autoscaler run`) that reads the master's operator API with an operator
//! identity (docs/autoscaling.md says why) and creates and deletes nodes through providers.
//!
//! Module map:
//! - [`config`]: node pools in a TOML file (shape, price, `spot`, min/max, cooldowns, provider).
//! - [`plan`]: pure scale-up planning: the demand simulated on hypothetical nodes of each pool
//!   with `gantry_placement` (the live path's placement code), cheapest per placed GPU first.
//! - [`consolidate`]: pure: which busy nodes could go because their tasks fit in the others'
//!   room (the live path's placer), most expensive first.
//! - [`core`]: the pure core: observations and the time in, [`core::Action`]s out (scale up,
//!   drain, delete, replace on notices), cost and counts per pool.
//! - [`cost`]: pure cost attribution: each task pays its dominant share of its node's price
//!   from staging to its end, per role, framework and user; the rest is the pools' idle cost.
//! - [`provider`]: the exec-plugin contract (JSON on stdin/stdout) and the `local` provider
//!   (real `gantry-agent` processes on this host, stand-in GPUs for GPU pools).
//! - [`runtime`]: the thin loop: `GET /api/v1/demand` and `/api/v1/agents`, a core round, the
//!   actions (providers, `POST /api/v1/agents/{id}/drain`), a status file.
//! - [`totals`]: the cost report's totals carried across restarts and HA failovers (etcd with
//!   `--etcd`, a local file otherwise).
//! - [`sim`]: the policy simulator on the same core: a workload (the Alibaba openb trace)
//!   replayed against pools with prices, against a static fleet sized for the peak; with
//!   consolidation, spot notices (seeded or from a file) and checkpoints (`sim/`: trace, spot,
//!   run).
//!
//! Crates chosen: `gantry-placement` for the simulation (the same code the master and the
//! schedulers place with), `gantry-master`'s operator client (reqwest + rustls on `ring`, as
//! `gantryctl`), `toml`/`serde` for pools, `humantime` for durations, `proptest` for the core's
//! invariants.

#![warn(missing_docs)]

pub mod config;
pub mod consolidate;
pub mod core;
pub mod cost;
pub mod plan;
pub mod provider;
pub mod runtime;
pub mod sim;
pub mod totals;
