//! Host ports in the core: the agent's port range (`--ports FIRST-LAST`, advertised as the
//! scalar resource `ports:N`), and the assignment of concrete ports to a task asking for
//! `ports:K`.
//!
//! The master accounts ports as a count, like Nomad's dynamic ports and Mesos's `ports`
//! resource reduced to its size: it never hands out more than the agent has. The agent picks
//! which ports: the lowest ports of its range that no live task of its own holds and that the
//! runtime could bind a moment before (a port held by a process outside Gantry is skipped).
//! A task's ports are kept in its record (log and checkpoint), so a restarted agent's
//! re-adopted tasks keep them; they are free again once the task is terminal.

use std::collections::BTreeSet;
use std::fmt;

use gantry_proto::resources::MILLI;

use super::AgentCore;

/// An inclusive range of host ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

/// Errors in a `--ports` value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PortRangeError {
    #[error("port range {0:?} is not of the form FIRST-LAST (e.g. 31000-32000) or `none`")]
    Syntax(String),
    #[error("port range {0:?}: FIRST must be at least 1 and not above LAST")]
    Order(String),
}

impl PortRange {
    /// Mesos's default range.
    pub const DEFAULT: PortRange = PortRange {
        first: 31000,
        last: 32000,
    };

    /// Parses `FIRST-LAST` (or one port); `none` gives `None` (no ports advertised).
    pub fn parse(text: &str) -> Result<Option<PortRange>, PortRangeError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        let (a, b) = text.split_once('-').unwrap_or((text, text));
        let num = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| PortRangeError::Syntax(text.to_string()))
        };
        let (first, last) = (num(a)?, num(b)?);
        if first == 0 || first > last {
            return Err(PortRangeError::Order(text.to_string()));
        }
        Ok(Some(PortRange { first, last }))
    }

    /// How many ports the range holds.
    pub fn len(&self) -> u64 {
        u64::from(self.last) - u64::from(self.first) + 1
    }

    /// Never true (a range holds at least one port); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    pub fn iter(&self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// How many ports a task asks for (`ports` must be a whole number).
pub fn wanted(milli: u64) -> Result<usize, String> {
    if !milli.is_multiple_of(MILLI) {
        return Err(format!(
            "port-unavailable: the task asks for {} ports; ports are counted in whole ports",
            milli as f64 / MILLI as f64
        ));
    }
    Ok((milli / MILLI) as usize)
}

/// Picks `k` ports of `range`, lowest first, skipping `held` (by live tasks) and `unbindable`
/// (found in use outside Gantry). `Err` is the task's `port-unavailable` message.
pub fn assign(
    range: Option<PortRange>,
    held: &BTreeSet<u16>,
    unbindable: &BTreeSet<u16>,
    k: usize,
) -> Result<Vec<u16>, String> {
    if k == 0 {
        return Ok(Vec::new());
    }
    let Some(range) = range else {
        return Err(format!(
            "port-unavailable: the task asks for {k} ports but this agent has no port range (--ports none)"
        ));
    };
    let picked: Vec<u16> = range
        .iter()
        .filter(|p| !held.contains(p) && !unbindable.contains(p))
        .take(k)
        .collect();
    if picked.len() < k {
        let held_here = held.iter().filter(|p| range.contains(**p)).count();
        let outside = unbindable
            .iter()
            .filter(|p| range.contains(**p) && !held.contains(p))
            .count();
        return Err(format!(
            "port-unavailable: the task asks for {k} ports but only {} of this agent's range {range} are free ({held_here} held by its tasks, {outside} in use outside Gantry)",
            picked.len()
        ));
    }
    Ok(picked)
}

/// The candidates (lowest first) found unbindable by `bindable` while looking for `k` bindable
/// ones: the runtime's probe before a launch asking for ports, passed to the core's launch.
pub fn probe(candidates: &[u16], k: usize, mut bindable: impl FnMut(u16) -> bool) -> BTreeSet<u16> {
    let mut busy = BTreeSet::new();
    let mut found = 0;
    for &port in candidates {
        if found == k {
            break;
        }
        if bindable(port) {
            found += 1;
        } else {
            busy.insert(port);
        }
    }
    busy
}

/// The environment a task with `ports` sees: `PORT` (the first), `PORT0`.. and
/// `GANTRY_PORTS` (comma-separated).
pub fn env(ports: &[u16]) -> Vec<(String, String)> {
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let mut out = vec![("PORT".to_string(), first.to_string())];
    for (i, p) in ports.iter().enumerate() {
        out.push((format!("PORT{i}"), p.to_string()));
    }
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    out.push(("GANTRY_PORTS".to_string(), list.join(",")));
    out
}

impl AgentCore {
    /// Ports held by the tasks that are not terminal.
    pub(super) fn held_ports(&self) -> BTreeSet<u16> {
        self.ckpt
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .flat_map(|t| t.ports.iter().copied())
            .collect()
    }

    /// The ports of the range no live task holds, lowest first: the candidates the runtime
    /// probes (binds) before a launch asking for ports.
    pub fn free_ports(&self) -> Vec<u16> {
        let Some(range) = self.config.ports else {
            return Vec::new();
        };
        let held = self.held_ports();
        range.iter().filter(|p| !held.contains(p)).collect()
    }
}
