//! # gantry-queue
//!
//! The ML GPU job queue on Gantry (binary `gantry-queue`; users' guide: docs/queue.md). Jobs
//! are gangs of identical workers (`min..max`, elastic when `min < max`) with a team, a
//! priority class, an optional deadline and GPU selector, and optional dependencies on other
//! jobs (`after`: Slurm's `afterok`). The queue orders eligible jobs by priority (with aging),
//! teams' weighted dominant share (with per-team GPU quotas, overall and per GPU model, that
//! borrow and lend within limits; GPU time over the run decides the rounding), deadline and
//! age; places them with `gantry_sdk::placement`
//! (offers, gangs); keeps a reservation for the first blocked job so backfill cannot delay it;
//! and lets blocked `critical`/`high` jobs preempt lower classes where that actually makes
//! room. Every pending job says why it waits and where it stands.
//!
//! Pure core, thin shells (as the master):
//!
//! - [`model`]: job specifications, priorities, states, the API's JSON views, and the records
//!   the store keeps.
//! - [`core`]: the pure queue (events, inputs and the time in; actions out). No clock, no I/O.
//! - [`store`]: the durable store (jobs with their attempts and states, usage history, the
//!   framework id) in [redb](https://docs.rs/redb), an embedded ACID database in pure Rust
//!   chosen over a hand-written file format for its crash safety (copy-on-write B-trees,
//!   checksummed commits); schema versioned.
//! - [`runtime`]: the framework (a `gantry_sdk::Scheduler`), the ticker and [`runtime::Shared`]:
//!   each event goes through the core, what changed is committed to the store, then the core's
//!   actions are sent to the master.
//! - [`auth`]: who may do what (pure): the ACL file (declared teams, who submits to which
//!   team up to which priority, team and queue administrators), callers, 400/401/403.
//! - [`sim`]: the simulator on the same core (`gantry-queue simulate`): a job trace on emulated
//!   agents with emulated time, against FIFO and EASY-backfill baselines.
//! - [`usage`]: GPU-hours and cost per team and user from the store's usage history
//!   (`GET /usage`, `gantry-queue usage`).
//! - [`budget`]: team budgets over a rolling period (pure): spending from workers' costs,
//!   submissions warned near a budget and held past it (`GET /budgets`).
//! - [`http`]: the API (`/jobs`, `/jobs/{id}/logs` relayed from the master, `/stats`, `/metrics`, `/shutdown`), in HTTPS with tokens and
//!   client certificates when an ACL file is given.

pub mod auth;
pub mod budget;
pub mod core;
pub mod http;
pub mod model;
pub mod runtime;
pub mod sim;
pub mod store;
pub mod usage;
