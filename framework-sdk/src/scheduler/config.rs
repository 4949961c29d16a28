//! [`DriverConfig`] and its builder: how to reach the masters and who this framework is.

use std::path::PathBuf;
use std::time::Duration;

#[allow(unused_imports)] // for the documentation's links
use super::{Driver, DriverHandle, Scheduler};
use crate::protocol::*;

/// How to reach the master and who this framework is.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Master addresses (`host:port`). The driver keeps a connection to each (see
    /// [`crate::transport::masters`]) and subscribes with the one that leads.
    pub masters: Vec<String>,
    /// TLS directory (see [`crate::transport::tls`]): `ca.pem` and this framework's
    /// `framework-PRINCIPAL.pem`/`.key`. The driver only reads it; issue the certificate with
    /// `gantryctl certs framework PRINCIPAL` (or, in development, `gantry_pki::load_or_issue`
    /// before running the driver).
    pub tls_dir: PathBuf,
    /// The framework's principal: the name in its certificate.
    pub principal: String,
    /// What the framework subscribes with (name, roles, capabilities, failover timeout).
    pub info: FrameworkInfo,
    /// First and largest reconnect delay (per master).
    pub backoff: (Duration, Duration),
    /// Give up when no master could be reached for this long (`None`: never).
    pub give_up_after: Option<Duration>,
    /// Built-in reconciliation on (re-)subscription and periodically (off by default; see
    /// [`crate::reconcile`]).
    pub reconcile: crate::reconcile::ReconcileConfig,
    /// Acknowledge status updates yourself, with [`DriverHandle::acknowledge`], once what they
    /// say is persisted (Mesos's explicit acknowledgements). Off by default: the driver
    /// acknowledges each update when [`Scheduler::status_update`] returns. On, every update the
    /// master (re)delivers reaches the scheduler, duplicates included: persist idempotently
    /// (by `update_id`) and acknowledge again.
    pub explicit_acks: bool,
}

impl DriverConfig {
    /// A framework named `principal` in `roles`, failover timeout 60 s.
    pub fn new(
        masters: Vec<String>,
        tls_dir: PathBuf,
        principal: &str,
        roles: Vec<String>,
    ) -> Self {
        Self {
            masters,
            tls_dir,
            principal: principal.to_string(),
            info: FrameworkInfo {
                framework_id: None,
                name: principal.to_string(),
                roles,
                capabilities: Vec::new(),
                failover_timeout_secs: 60.0,
                min_allocatable: Vec::new(),
                suppressed_roles: Vec::new(),
            },
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            give_up_after: None,
            reconcile: Default::default(),
            explicit_acks: false,
        }
    }

    /// A configuration built step by step, so options added later break nobody:
    ///
    /// ```
    /// use std::time::Duration;
    /// use gantry_sdk::protocol::Capability;
    /// use gantry_sdk::DriverConfig;
    /// let config = DriverConfig::builder("sweep")
    ///     .master("10.0.0.1:5050")
    ///     .master("10.0.0.2:5050")
    ///     .tls_dir("/etc/gantry/tls")
    ///     .role("ml")
    ///     .name("hyper-parameter sweep")
    ///     .capability(Capability::PartitionAware)
    ///     .failover_timeout(Duration::from_secs(3600))
    ///     .build();
    /// assert_eq!(config.principal, "sweep");
    /// assert_eq!(config.info.name, "hyper-parameter sweep");
    /// assert_eq!(config.info.roles, ["ml"]);
    /// ```
    pub fn builder(principal: &str) -> DriverConfigBuilder {
        DriverConfigBuilder(DriverConfig::new(
            Vec::new(),
            PathBuf::from("."),
            principal,
            Vec::new(),
        ))
    }
}

/// Builds a [`DriverConfig`] ([`DriverConfig::builder`]): the principal names the framework
/// until [`DriverConfigBuilder::name`] says otherwise; no role means `*` is not assumed, the
/// master refuses a subscription without one.
#[derive(Debug, Clone)]
pub struct DriverConfigBuilder(DriverConfig);

impl DriverConfigBuilder {
    /// One more master address (`host:port`).
    pub fn master(mut self, addr: impl Into<String>) -> Self {
        self.0.masters.push(addr.into());
        self
    }
    /// The TLS directory (`ca.pem`, `framework-PRINCIPAL.pem`/`.key`).
    pub fn tls_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.0.tls_dir = dir.into();
        self
    }
    /// One more role to be offered resources in.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.0.info.roles.push(role.into());
        self
    }
    /// The framework's name (shown in `/state`; the principal by default).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.0.info.name = name.into();
        self
    }
    /// One more capability.
    pub fn capability(mut self, capability: Capability) -> Self {
        if !self.0.info.capabilities.contains(&capability) {
            self.0.info.capabilities.push(capability);
        }
        self
    }
    /// How long the master keeps the tasks while the framework is away (60 s by default).
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.0.info.failover_timeout_secs = timeout.as_secs_f64();
        self
    }
    /// Resume this framework id (kept from an earlier run).
    pub fn framework_id(mut self, id: FrameworkId) -> Self {
        self.0.info.framework_id = Some(id);
        self
    }
    /// Acknowledge updates yourself ([`DriverConfig::explicit_acks`]).
    pub fn explicit_acks(mut self) -> Self {
        self.0.explicit_acks = true;
        self
    }
    /// Reconciliation ([`DriverConfig::reconcile`]).
    pub fn reconcile(mut self, reconcile: crate::reconcile::ReconcileConfig) -> Self {
        self.0.reconcile = reconcile;
        self
    }
    /// Give up when no master answers for this long.
    pub fn give_up_after(mut self, limit: Duration) -> Self {
        self.0.give_up_after = Some(limit);
        self
    }
    /// The configuration.
    pub fn build(self) -> DriverConfig {
        self.0
    }
}
