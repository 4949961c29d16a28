//! Replaying a [`Scenario`] against the real allocator in simulated time: one JSON line per
//! offer and rescind, then the [`Summary`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use gantry_proto::messages::Demand;
use gantry_proto::{AgentId, FrameworkId, OfferId, ResourceLimits, Resources};
use serde::{Deserialize, Serialize};

use super::{ClusterSettings, Event, EventKind, Scenario};
use crate::allocator::{Allocator, AllocatorConfig, Millis, OfferRecord};
use crate::simulate::SimError;

// ---------------------------------------------------------------------------------------------
// output lines

#[derive(Serialize)]
struct OfferLine<'a> {
    at_ms: Millis,
    offer: String,
    framework: &'a str,
    agent: &'a str,
    resources: Resources,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    reserved: &'a BTreeMap<String, Resources>,
}

#[derive(Serialize)]
struct RescindLine<'a> {
    at_ms: Millis,
    rescind: String,
    framework: &'a str,
    agent: &'a str,
}

/// Allocation and share of a role or framework in the summary.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShareSummary {
    pub allocated: Resources,
    pub dominant_share: f64,
}

/// The final summary line's content.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Summary {
    pub roles: BTreeMap<String, ShareSummary>,
    pub frameworks: BTreeMap<String, ShareSummary>,
    /// With `resource_seconds = true`: per role (subtree) and per framework (over its roles),
    /// per kind, allocated amount × seconds from time 0 to the end of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_seconds: Option<ResourceSecondsSummary>,
}

/// Resource-seconds per role and per framework name, per kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ResourceSecondsSummary {
    pub roles: BTreeMap<String, BTreeMap<String, f64>>,
    pub frameworks: BTreeMap<String, BTreeMap<String, f64>>,
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    summary: &'a Summary,
}

// ---------------------------------------------------------------------------------------------
// the replay

fn parse_res(index: usize, kind: &str, text: &str) -> Result<Resources, SimError> {
    Resources::parse(text)
        .map_err(|e| SimError::event(index, kind, format!("bad resources {text:?}: {e}")))
}

fn parse_reserved(
    index: usize,
    kind: &str,
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Resources>, SimError> {
    map.iter()
        .map(|(role, text)| Ok((role.clone(), parse_res(index, kind, text)?)))
        .collect()
}

fn refuse_ms(index: usize, kind: &str, secs: Option<f64>) -> Result<Option<Millis>, SimError> {
    match secs {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => {
            Ok(Some((s * 1000.0).round().min(u64::MAX as f64) as Millis))
        }
        Some(s) => Err(SimError::event(
            index,
            kind,
            format!("refuse_seconds {s} must be a non-negative number"),
        )),
    }
}

/// The name a scenario gave `id`, or `?`.
fn name_of<'a, K: std::hash::Hash + Eq>(names: &'a HashMap<K, String>, id: &K) -> &'a str {
    names.get(id).map_or("?", String::as_str)
}

/// Writes `line` as one JSON line.
fn write_line(out: &mut impl Write, line: &impl Serialize) -> Result<(), SimError> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Replays scenarios against an [`Allocator`], writing JSON lines.
pub struct Replay<'w, W: Write> {
    alloc: Allocator,
    out: &'w mut W,
    agents: HashMap<String, AgentId>,
    agent_names: HashMap<AgentId, String>,
    frameworks: HashMap<String, FrameworkId>,
    framework_names: HashMap<FrameworkId, String>,
    next_id: u128,
    /// Offer lines written so far.
    pub offers_printed: usize,
}

impl<'w, W: Write> Replay<'w, W> {
    fn new(settings: &ClusterSettings, out: &'w mut W) -> Self {
        let config = AllocatorConfig {
            filter_gpu_resources: settings.filter_gpu_resources,
            fairness_excluded_resources: settings.fairness_excluded_resources.clone(),
            offer_timeout_ms: settings.offer_timeout_ms,
            offer_id_seed: 0,
            ..Default::default()
        };
        Self {
            alloc: Allocator::new(config),
            out,
            agents: HashMap::new(),
            agent_names: HashMap::new(),
            frameworks: HashMap::new(),
            framework_names: HashMap::new(),
            next_id: 0,
            offers_printed: 0,
        }
    }

    fn agent(&self, index: usize, kind: &str, name: &str) -> Result<AgentId, SimError> {
        self.agents
            .get(name)
            .copied()
            .ok_or_else(|| SimError::event(index, kind, format!("no such agent {name:?}")))
    }

    fn framework(&self, index: usize, kind: &str, name: &str) -> Result<FrameworkId, SimError> {
        self.frameworks
            .get(name)
            .copied()
            .ok_or_else(|| SimError::event(index, kind, format!("no such framework {name:?}")))
    }

    /// The framework's outstanding offers on the agent named by event `i` (an error if none).
    fn event_offers(
        &self,
        i: usize,
        k: &str,
        framework: &str,
        agent: &str,
    ) -> Result<Vec<OfferId>, SimError> {
        let f = self.framework(i, k, framework)?;
        let a = self.agent(i, k, agent)?;
        let offers = self.alloc.offers_on(f, a);
        if offers.is_empty() {
            return Err(SimError::event(
                i,
                k,
                format!("framework {framework:?} has no outstanding offer on agent {agent:?}"),
            ));
        }
        Ok(offers)
    }

    fn print_offers(&mut self, offers: &[OfferRecord]) -> Result<(), SimError> {
        for o in offers {
            let line = OfferLine {
                at_ms: o.created_at,
                offer: o.id.to_string(),
                framework: name_of(&self.framework_names, &o.framework),
                agent: name_of(&self.agent_names, &o.agent),
                resources: o.resources.total(),
                reserved: &o.resources.reserved,
            };
            write_line(&mut *self.out, &line)?;
            self.offers_printed += 1;
        }
        Ok(())
    }

    fn print_rescinds(&mut self, at_ms: Millis, offers: &[OfferRecord]) -> Result<(), SimError> {
        for o in offers {
            let line = RescindLine {
                at_ms,
                rescind: o.id.to_string(),
                framework: name_of(&self.framework_names, &o.framework),
                agent: name_of(&self.agent_names, &o.agent),
            };
            write_line(&mut *self.out, &line)?;
        }
        Ok(())
    }

    fn allocate(&mut self, now: Millis) -> Result<(), SimError> {
        let offers = self.alloc.allocate(now);
        self.print_offers(&offers)
    }

    fn expire(&mut self, now: Millis) -> Result<(), SimError> {
        let gone = self.alloc.expire_offers(now);
        self.print_rescinds(now, &gone)
    }

    fn apply(&mut self, ev: &Event) -> Result<(), SimError> {
        let (i, k, now) = (ev.index, ev.kind.name(), ev.at_ms);
        match &ev.kind {
            EventKind::AddAgent {
                agent,
                resources,
                reserved,
                attributes: _,
            } => {
                if self.agents.contains_key(agent) {
                    return Err(SimError::event(
                        i,
                        k,
                        format!("agent {agent:?} already exists"),
                    ));
                }
                let unres = parse_res(i, k, resources)?;
                let resv = parse_reserved(i, k, reserved)?;
                self.next_id += 1;
                let id = AgentId::from_u128(self.next_id);
                self.agents.insert(agent.clone(), id);
                self.agent_names.insert(id, agent.clone());
                self.alloc.add_agent(id, agent, unres, resv);
            }
            EventKind::RemoveAgent { agent } => {
                let id = self.agent(i, k, agent)?;
                let gone = self.alloc.remove_agent(id);
                self.print_rescinds(now, &gone)?;
                self.agents.remove(agent);
            }
            EventKind::UpdateAgent {
                agent,
                resources,
                reserved,
            } => {
                let id = self.agent(i, k, agent)?;
                let unres = parse_res(i, k, resources)?;
                let resv = parse_reserved(i, k, reserved)?;
                let gone = self.alloc.update_agent(id, unres, resv);
                self.print_rescinds(now, &gone)?;
            }
            EventKind::AddFramework {
                framework,
                roles,
                capabilities,
                demand,
            } => {
                if self.frameworks.contains_key(framework) {
                    return Err(SimError::event(
                        i,
                        k,
                        format!("framework {framework:?} already exists"),
                    ));
                }
                if roles.is_empty() {
                    return Err(SimError::event(
                        i,
                        k,
                        "a framework needs at least one role".to_string(),
                    ));
                }
                let mut gpu = false;
                for c in capabilities {
                    match c.to_ascii_uppercase().as_str() {
                        "GPU" | "GPU_RESOURCES" | "GPURESOURCES" => gpu = true,
                        other => {
                            return Err(SimError::event(
                                i,
                                k,
                                format!("unknown capability {other:?} (known: GPU)"),
                            ))
                        }
                    }
                }
                let demand = match demand {
                    Some(d) => Some(Demand {
                        task: parse_res(i, k, &d.task)?,
                        count: d.count,
                        gpu_model: None,
                    }),
                    None => None,
                };
                self.next_id += 1;
                let id = FrameworkId::from_u128(self.next_id);
                self.frameworks.insert(framework.clone(), id);
                self.framework_names.insert(id, framework.clone());
                self.alloc.add_framework(id, framework, roles, gpu, demand);
            }
            EventKind::RemoveFramework { framework } => {
                let id = self.framework(i, k, framework)?;
                self.alloc.remove_framework(id);
                self.frameworks.remove(framework);
            }
            EventKind::Accept {
                framework,
                agent,
                resources,
                refuse_seconds,
                reserve,
                unreserve,
            } => {
                let offers = self.event_offers(i, k, framework, agent)?;
                let refuse = refuse_ms(i, k, *refuse_seconds)?;
                for (role, text) in reserve {
                    let amount = parse_res(i, k, text)?;
                    self.change_reservation(i, k, &offers, role, &amount, true)?;
                }
                for (role, text) in unreserve {
                    let amount = parse_res(i, k, text)?;
                    self.change_reservation(i, k, &offers, role, &amount, false)?;
                }
                let mut want = match resources {
                    Some(text) => Some(parse_res(i, k, text)?),
                    None => None,
                };
                // The accept acts on all of the framework's offers on the agent, with one filter
                // over the union of what it does not use.
                // Validate that the requested part fits in the offers together before using any.
                if let Some(w) = &want {
                    let mut all = Resources::new();
                    for o in &offers {
                        if let Some(rec) = self.alloc.offer(*o) {
                            all.add_assign(&rec.resources.total());
                        }
                    }
                    if !all.contains(w) {
                        return Err(SimError::event(i, k, format!("resources {w} exceed the outstanding offers ({all}) of {framework:?} on {agent:?}")));
                    }
                }
                let mut parts = Vec::with_capacity(offers.len());
                for o in offers {
                    let Some(rec) = self.alloc.offer(o) else {
                        continue;
                    };
                    let used = match &mut want {
                        None => rec.resources.clone(),
                        Some(w) => rec.resources.clone().carve(w),
                    };
                    parts.push((o, used));
                }
                self.alloc
                    .accept_offers(&parts, refuse, now)
                    .map_err(|e| SimError::event(i, k, e.to_string()))?;
            }
            EventKind::Decline {
                framework,
                agent,
                refuse_seconds,
            } => {
                let offers = self.event_offers(i, k, framework, agent)?;
                let refuse = refuse_ms(i, k, *refuse_seconds)?;
                // One decline: all the offers on the agent, one filter over their union.
                self.alloc
                    .decline_offers(&offers, refuse, now)
                    .map_err(|e| SimError::event(i, k, e.to_string()))?;
            }
            EventKind::Recover {
                framework,
                agent,
                resources,
            } => {
                let f = self.framework(i, k, framework)?;
                let a = self.agent(i, k, agent)?;
                let want = parse_res(i, k, resources)?;
                let in_use = self.alloc.in_use(f, a);
                if !in_use.total().contains(&want) {
                    return Err(SimError::event(i, k, format!("framework {framework:?} has only {} in use on agent {agent:?}, can not recover {want}", in_use.total())));
                }
                let r = in_use.clone().carve(&mut want.clone());
                self.alloc.recover(f, a, &r);
            }
            EventKind::Suppress { framework, role } | EventKind::Revive { framework, role } => {
                let f = self.framework(i, k, framework)?;
                if let Some(role) = role {
                    if !self.alloc.framework_roles(f).iter().any(|r| r == role) {
                        return Err(SimError::event(
                            i,
                            k,
                            format!("framework {framework:?} is not subscribed to role {role:?}"),
                        ));
                    }
                }
                if matches!(ev.kind, EventKind::Suppress { .. }) {
                    self.alloc.suppress(f, role.as_deref());
                } else {
                    self.alloc.revive(f, role.as_deref());
                }
            }
            EventKind::SetWeight { role, weight } => {
                if !(weight.is_finite() && *weight > 0.0) {
                    return Err(SimError::event(
                        i,
                        k,
                        format!("weight {weight} must be a positive number"),
                    ));
                }
                self.alloc.set_weight(role, *weight);
            }
            EventKind::SetQuota {
                role,
                guarantee,
                limit,
            } => {
                let g = guarantee
                    .as_deref()
                    .map(|t| parse_res(i, k, t))
                    .transpose()?;
                let l = limit
                    .as_deref()
                    .map(|t| {
                        ResourceLimits::parse(t)
                            .map_err(|e| SimError::event(i, k, format!("bad limit {t:?}: {e}")))
                    })
                    .transpose()?;
                self.alloc
                    .set_quota(role, g, l)
                    .map_err(|e| SimError::event(i, k, e.to_string()))?;
            }
            EventKind::SetDemand {
                framework,
                task,
                count,
            } => {
                let f = self.framework(i, k, framework)?;
                let task = parse_res(i, k, task)?;
                self.alloc.set_demand(
                    f,
                    Some(Demand {
                        task,
                        count: *count,
                        gpu_model: None,
                    }),
                );
            }
        }
        if ev.kind.triggers_allocation() {
            self.allocate(now)?;
        }
        Ok(())
    }

    fn change_reservation(
        &mut self,
        i: usize,
        k: &str,
        offers: &[OfferId],
        role: &str,
        amount: &Resources,
        reserve: bool,
    ) -> Result<(), SimError> {
        // Spread the operation over the offers on the agent, in offer order.
        let mut left = amount.clone();
        for o in offers {
            if left.is_empty() {
                break;
            }
            let Some(rec) = self.alloc.offer(*o) else {
                continue;
            };
            let pool = if reserve {
                rec.resources.unreserved.clone()
            } else {
                rec.resources
                    .reserved
                    .get(role)
                    .cloned()
                    .unwrap_or_default()
            };
            let part = Resources::elementwise_min(&pool, &left);
            if part.is_empty() {
                continue;
            }
            let res = if reserve {
                self.alloc.reserve(*o, role, &part)
            } else {
                self.alloc.unreserve(*o, role, &part)
            };
            res.map_err(|e| SimError::event(i, k, e.to_string()))?;
            left = left.saturating_sub(&part);
        }
        if !left.is_empty() {
            let op = if reserve { "reserve" } else { "unreserve" };
            return Err(SimError::event(
                i,
                k,
                format!("can not {op} {amount} for role {role:?}: not in the outstanding offers"),
            ));
        }
        Ok(())
    }

    fn summary(&self, resource_seconds: bool) -> Summary {
        let mut s = Summary::default();
        if resource_seconds {
            let mut r = ResourceSecondsSummary::default();
            for rs in self.alloc.resource_seconds() {
                let into = match &rs.framework {
                    None => r.roles.entry(rs.role.clone()).or_default(),
                    Some((_, name)) => r.frameworks.entry(name.clone()).or_default(),
                };
                for (kind, secs) in rs.seconds {
                    *into.entry(kind).or_default() += secs;
                }
            }
            s.resource_seconds = Some(r);
        }
        for role in self.alloc.role_names() {
            s.roles.insert(
                role.to_string(),
                ShareSummary {
                    allocated: self.alloc.role_allocated(role),
                    dominant_share: self.alloc.role_share(role),
                },
            );
        }
        for (name, id) in &self.frameworks {
            s.frameworks.insert(
                name.clone(),
                ShareSummary {
                    allocated: self.alloc.framework_allocated(*id).total(),
                    dominant_share: self.alloc.framework_share(*id),
                },
            );
        }
        s
    }
}

/// Runs a scenario, writing offer and rescind lines and the final summary line to `out`.
/// Lines written before an error stay written; the error names the event index.
pub fn run_scenario<W: Write>(scenario: &Scenario, out: &mut W) -> Result<Summary, SimError> {
    let c = &scenario.cluster;
    let mut replay = Replay::new(c, out);
    for r in &scenario.roles {
        if let Some(w) = r.weight {
            if !(w.is_finite() && w > 0.0) {
                return Err(SimError::Parse(format!(
                    "role {:?}: weight {w} must be a positive number",
                    r.name
                )));
            }
            replay.alloc.set_weight(&r.name, w);
        }
        let g = r
            .quota_guarantee
            .as_deref()
            .map(Resources::parse)
            .transpose();
        let l = r
            .quota_limit
            .as_deref()
            .map(ResourceLimits::parse)
            .transpose();
        let (g, l) = match (g, l) {
            (Ok(g), Ok(l)) => (g, l),
            (Err(e), _) | (_, Err(e)) => {
                return Err(SimError::Parse(format!("role {:?}: {e}", r.name)))
            }
        };
        if g.is_some() || l.is_some() {
            replay
                .alloc
                .set_quota(&r.name, g, l)
                .map_err(|e| SimError::Parse(format!("role {:?}: {e}", r.name)))?;
        } else {
            replay.alloc.set_weight(&r.name, r.weight.unwrap_or(1.0));
        }
    }
    let interval = c.allocation_interval_ms;
    let last = scenario.events.last().map(|e| e.at_ms).unwrap_or(0);
    let end = c.end_ms.unwrap_or(last.saturating_add(interval));
    let mut next_event = 0usize;
    let mut t: Millis = 0;
    loop {
        // Allocations are constant since the last step: integrate them up to now.
        replay.alloc.accrue(t);
        replay.expire(t)?;
        while next_event < scenario.events.len() && scenario.events[next_event].at_ms == t {
            let ev = scenario.events[next_event].clone();
            replay.apply(&ev)?;
            next_event += 1;
        }
        // "Quiet": this millisecond's batch made no offer. Allocation is a function of the
        // state and, through filter expiry only, of time, so until an event, an offer timeout or
        // a filter expiry, later batches would make none either and are skipped.
        let mut quiet = false;
        if t.is_multiple_of(interval) {
            let before = replay.offers_printed;
            replay.allocate(t)?;
            quiet = replay.offers_printed == before;
        }
        // Next point of interest: an event, a batch, an offer timeout.
        let first_batch_from = |x: Millis| x.div_ceil(interval).saturating_mul(interval);
        let mut next = if quiet {
            match replay.alloc.next_filter_expiry() {
                Some(e) => first_batch_from(e.max(t.saturating_add(1))),
                None => Millis::MAX,
            }
        } else {
            (t / interval + 1).saturating_mul(interval)
        };
        if let Some(e) = scenario.events.get(next_event) {
            next = next.min(e.at_ms);
        }
        if let Some(x) = replay.alloc.next_offer_expiry() {
            next = next.min(x.max(t.saturating_add(1)));
        }
        if next > end || next == t {
            break;
        }
        t = next;
    }
    replay.alloc.accrue(end.max(t));
    let summary = replay.summary(c.resource_seconds);
    write_line(&mut *replay.out, &SummaryLine { summary: &summary })?;
    replay.out.flush()?;
    Ok(summary)
}
