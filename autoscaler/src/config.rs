//! Node pools in a TOML file (docs/autoscaling.md, "Pools"):
//!
//! ```toml
//! [autoscaler]
//! interval = "2s"                 # how often the loop observes and decides
//! spot_failures_before_fallback = 2
//!
//! [[pool]]
//! name = "a100-spot"
//! cpus = 16
//! mem = 65536                     # MiB
//! disk = 200000                   # MiB
//! gpus = 4
//! gpu_model = "NVIDIA A100-SXM4-40GB"
//! attributes = { zone = "a" }
//! price_per_hour = 4.10
//! spot = true
//! min = 0
//! max = 8
//! scale_up_cooldown = "0s"
//! scale_down_cooldown = "5m"
//! provision_timeout = "10m"       # a node not registered by then is deleted as failed
//! fallback = "a100"               # on-demand pool that replaces spot capacity that keeps failing
//! provider = { kind = "exec", program = "/etc/gantry/provider.sh" }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML, or fields of the wrong type.
    #[error("parsing {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A pool that cannot work as written.
    #[error("pool {pool:?}: {message}")]
    Pool {
        /// The pool's name.
        pool: String,
        /// What is wrong.
        message: String,
    },
    /// No pools.
    #[error("no [[pool]] in the configuration")]
    NoPools,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Loop settings.
    #[serde(default)]
    pub autoscaler: Settings,
    /// The pools, in the order given.
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolSpec>,
}

/// `[autoscaler]`: loop settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// How often the loop observes the master and decides.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// After this many interruptions in a row of a spot pool's nodes, its replacements go to
    /// its `fallback` pool (on-demand) instead; 0 disables the fallback.
    pub spot_failures_before_fallback: u32,
    /// How long a spot notice gives a node before it goes (the drain's deadline).
    #[serde(deserialize_with = "duration")]
    pub notice_deadline: Duration,
    /// Drain busy nodes whose tasks fit in the other nodes' room (Karpenter's consolidation),
    /// one at a time: off unless set.
    pub consolidation: bool,
    /// How long a node must stay removable that way before it is drained.
    #[serde(deserialize_with = "duration")]
    pub consolidation_delay: Duration,
    /// The deadline of a consolidation's drain: its tasks' time to move on their own before
    /// what is left is killed (reason `drain-deadline`, which frameworks retry elsewhere).
    #[serde(deserialize_with = "duration")]
    pub consolidation_deadline: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(2),
            spot_failures_before_fallback: 2,
            notice_deadline: Duration::from_secs(120),
            consolidation: false,
            consolidation_delay: Duration::from_secs(600),
            consolidation_deadline: Duration::from_secs(600),
        }
    }
}

/// One node pool: the shape of its agents, its price, its bounds and its provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// Unique name; node ids of this pool start with it.
    pub name: String,
    /// CPUs of one node.
    pub cpus: f64,
    /// Memory of one node, MiB.
    pub mem: u64,
    /// Disk of one node, MiB.
    #[serde(default)]
    pub disk: u64,
    /// GPUs of one node.
    #[serde(default)]
    pub gpus: u32,
    /// The GPUs' model (as NVML names it); required when `gpus > 0`.
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Agent attributes of the pool's nodes (`pool` is added).
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// Price of one node per hour (any currency; reports use the same).
    pub price_per_hour: f64,
    /// Spot (interruptible) capacity.
    #[serde(default)]
    pub spot: bool,
    /// Fewest nodes; the autoscaler keeps at least this many and never scales below it.
    #[serde(default)]
    pub min: u32,
    /// Most nodes, provisioning and draining ones included.
    pub max: u32,
    /// After a scale-up, how long before the pool scales up again.
    #[serde(default, deserialize_with = "duration")]
    pub scale_up_cooldown: Duration,
    /// How long a node stays idle before it is drained and deleted.
    #[serde(deserialize_with = "duration", default = "default_scale_down")]
    pub scale_down_cooldown: Duration,
    /// How long a created node may take to register before it is deleted as failed.
    #[serde(deserialize_with = "duration", default = "default_provision_timeout")]
    pub provision_timeout: Duration,
    /// The pool (on-demand) that replaces this spot pool's capacity once its nodes keep
    /// being interrupted.
    #[serde(default)]
    pub fallback: Option<String>,
    /// Who creates and deletes the nodes.
    pub provider: ProviderSpec,
}

fn default_provision_timeout() -> Duration {
    Duration::from_secs(600)
}

fn default_scale_down() -> Duration {
    Duration::from_secs(600)
}

/// A pool's provider.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ProviderSpec {
    /// Real `gantry-agent` processes on this host ([`crate::provider::LocalProvider`]).
    Local,
    /// An exec plugin: JSON on stdin/stdout ([`crate::provider::ExecProvider`]).
    Exec {
        /// The program (run with no arguments, one request per run).
        program: PathBuf,
        /// How long one request may take.
        #[serde(default = "default_exec_timeout", deserialize_with = "duration")]
        timeout: Duration,
    },
}

fn default_exec_timeout() -> Duration {
    Duration::from_secs(300)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            e => e,
        })
    }

    /// Parses and checks a configuration.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        config.check()?;
        Ok(config)
    }

    /// Checks what serde cannot: names, bounds, shapes, fallbacks.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.pools.is_empty() {
            return Err(ConfigError::NoPools);
        }
        let bad = |pool: &PoolSpec, message: &str| ConfigError::Pool {
            pool: pool.name.clone(),
            message: message.to_string(),
        };
        for (i, p) in self.pools.iter().enumerate() {
            if self.pools[..i].iter().any(|q| q.name == p.name) {
                return Err(bad(p, "defined twice"));
            }
        }
        for p in &self.pools {
            let name_ok = !p.name.is_empty()
                && p.name.len() <= 48
                && p.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !name_ok {
                return Err(bad(p, "name must be 1-48 of [A-Za-z0-9_-]"));
            }
            if !(p.cpus.is_finite() && p.cpus > 0.0 && p.cpus <= 1.0e6) {
                return Err(bad(p, "cpus must be above 0"));
            }
            if p.mem == 0 {
                return Err(bad(p, "mem must be above 0"));
            }
            if p.gpus > 0 && p.gpu_model.as_deref().is_none_or(str::is_empty) {
                return Err(bad(p, "a pool with gpus needs gpu_model"));
            }
            if p.gpus > 256 {
                return Err(bad(p, "at most 256 gpus per node"));
            }
            if !(p.price_per_hour.is_finite() && p.price_per_hour >= 0.0) {
                return Err(bad(p, "price_per_hour must be 0 or more"));
            }
            if p.max == 0 || p.min > p.max {
                return Err(bad(p, "needs 0 <= min <= max and max >= 1"));
            }
            if let Some(f) = &p.fallback {
                match self.pools.iter().find(|q| &q.name == f) {
                    None => return Err(bad(p, &format!("fallback pool {f:?} is not defined"))),
                    Some(q) if q.spot => {
                        return Err(bad(p, &format!("fallback pool {f:?} is spot too")))
                    }
                    Some(_) if !p.spot => return Err(bad(p, "only a spot pool has a fallback")),
                    Some(_) => {}
                }
            }
            for k in p.attributes.keys() {
                if k == "pool" || k == PRICE_ATTRIBUTE {
                    return Err(bad(
                        p,
                        &format!("the attribute `{k}` is set by the autoscaler"),
                    ));
                }
                let key_ok = !k.is_empty() && !k.contains([':', ';']);
                if !key_ok {
                    return Err(bad(p, &format!("attribute key {k:?}: no `:` or `;`")));
                }
            }
            if let Some((k, _)) = p.attributes.iter().find(|(_, v)| v.contains(';')) {
                return Err(bad(p, &format!("attribute {k:?}: its value has a `;`")));
            }
        }
        Ok(())
    }
}

/// The agent attribute that carries a node's price per hour, as a decimal string (the
/// contract between the autoscaler's pools, `gantry-agent --price-per-hour`, the master's
/// usage and the queue's budgets).
pub const PRICE_ATTRIBUTE: &str = "price_per_hour";

/// A price as the attribute carries it: a plain decimal (`36`, `4.1`, `0.25`), never an
/// exponent.
pub fn price_text(price: f64) -> String {
    // `Display` for f64 never uses an exponent and round-trips.
    format!("{price}")
}

impl PoolSpec {
    /// The node's `--resources` for `gantry-agent` (GPUs are discovered, not listed).
    pub fn agent_resources(&self) -> String {
        let mut r = format!("cpus:{};mem:{}", self.cpus, self.mem);
        if self.disk > 0 {
            r.push_str(&format!(";disk:{}", self.disk));
        }
        r
    }

    /// The node's `--attributes` for `gantry-agent`: `pool:NAME` and `price_per_hour:PRICE`
    /// (the pool's price as a decimal string, the contract by which the master and the queue
    /// price what runs on the node), then the pool's own attributes.
    pub fn agent_attributes(&self) -> String {
        let mut a = format!(
            "pool:{};price_per_hour:{}",
            self.name,
            price_text(self.price_per_hour)
        );
        for (k, v) in &self.attributes {
            a.push_str(&format!(";{k}:{v}"));
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
        [autoscaler]
        interval = "1s"
        [[pool]]
        name = "a100-spot"
        cpus = 8
        mem = 32768
        gpus = 4
        gpu_model = "NVIDIA A100-SXM4-40GB"
        price_per_hour = 4.0
        spot = true
        max = 3
        scale_down_cooldown = "30s"
        fallback = "a100"
        provider = { kind = "local" }
        [[pool]]
        name = "a100"
        cpus = 8
        mem = 32768
        gpus = 4
        gpu_model = "NVIDIA A100-SXM4-40GB"
        price_per_hour = 12.0
        min = 1
        max = 3
        provider = { kind = "exec", program = "/bin/provider", timeout = "10s" }
    "#;

    #[test]
    fn a_good_file_parses_with_defaults() {
        let c = Config::parse(OK).unwrap();
        assert_eq!(c.pools.len(), 2);
        assert_eq!(c.autoscaler.interval, Duration::from_secs(1));
        assert_eq!(c.pools[0].scale_down_cooldown, Duration::from_secs(30));
        assert_eq!(c.pools[1].scale_down_cooldown, Duration::from_secs(600));
        assert_eq!(
            c.pools[1].provider,
            ProviderSpec::Exec {
                program: "/bin/provider".into(),
                timeout: Duration::from_secs(10)
            }
        );
        assert_eq!(c.pools[0].agent_resources(), "cpus:8;mem:32768");
        assert_eq!(
            c.pools[0].agent_attributes(),
            "pool:a100-spot;price_per_hour:4"
        );
        let mut p = c.pools[1].clone();
        p.price_per_hour = 4.1;
        p.attributes.insert("zone".into(), "a".into());
        assert_eq!(p.agent_attributes(), "pool:a100;price_per_hour:4.1;zone:a");
        assert_eq!(price_text(0.000001), "0.000001");
        assert_eq!(price_text(1e9), "1000000000");
    }

    #[test]
    fn bad_pools_get_clear_errors() {
        let cases = [
            ("max = 3", "max = 0", "min <= max"),
            ("fallback = \"a100\"", "fallback = \"nope\"", "not defined"),
            (
                "gpu_model = \"NVIDIA A100-SXM4-40GB\"\n        price_per_hour = 4.0",
                "price_per_hour = 4.0",
                "needs gpu_model",
            ),
            ("name = \"a100\"", "name = \"a100-spot\"", "defined twice"),
            ("interval = \"1s\"", "interval = \"soon\"", "soon"),
            (
                "spot = true",
                "spot = true\n        colour = 1",
                "unknown field",
            ),
            (
                "spot = true",
                "spot = true\n        attributes = { price_per_hour = \"1\" }",
                "set by the autoscaler",
            ),
            (
                "spot = true",
                "spot = true\n        attributes = { zone = \"a;b\" }",
                "has a `;`",
            ),
        ];
        for (from, to, want) in cases {
            let text = OK.replacen(from, to, 1);
            assert_ne!(text, OK, "{from}");
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{to}: {e}");
        }
        assert!(matches!(
            Config::parse("[autoscaler]\n").unwrap_err(),
            ConfigError::NoPools
        ));
    }
}
