//! Usage and cost from the persistent history (`super::history`): CPU-, memory- and GPU-hours
//! of resources *used by tasks* (from `RUNNING` to the end; resources held in offers are not
//! use and are reported apart, `held_offers`) over a window, per role, framework or user, and
//! what they cost where agents carry a price. PURE: the history's events in, the report out.
//!
//! A task counts from the first `RUNNING` the history holds to its first terminal state (or
//! the window's end while it runs), clipped to the window; a task whose `RUNNING` fell out of
//! the history is not counted, so a report reaches back only as far as the history
//! (`history_from_ms` in the report; `--history-events` bounds it).
//!
//! **Cost.** An agent's price is its attribute `price_per_hour` (`gantry-agent
//! --price-per-hour`), carried with its total resources on the `agent_added` / `agent_updated`
//! events. A task pays `price × share × time`, its share dominant over the agent's shape
//! ([`gantry_placement::cost::dominant_share`], the autoscaler's attribution too), at the price
//! and shape the agent had when the task started running (the latest known when the history
//! does not say). An
//! agent's **idle cost** is its price × the time it was registered in the window (from its
//! `agent_added`, or the history's start, to its `agent_removed`) less what its tasks paid for
//! that time (never below 0). Agents the history does not describe (their events trimmed) are
//! priced from the live state when the caller passes them.
//!
//! [`Meter`] adds the same spans up for ever, for the `gantry_usage_*_total` counters
//! (`super::metrics`): fed the same events as the history, it agrees with a report over the
//! whole history.

use std::collections::{BTreeMap, HashMap};

use gantry_placement::cost::{dominant_share, Amounts};
use serde_json::{json, Value};

use crate::registry::HistoryEvent;

/// How a report groups tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    Role,
    Framework,
    User,
}

impl UsageBy {
    /// `role`, `framework` or `user`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "role" => Ok(UsageBy::Role),
            "framework" => Ok(UsageBy::Framework),
            "user" => Ok(UsageBy::User),
            other => Err(format!("by={other:?}: role, framework or user")),
        }
    }
}

const TERMINAL: [&str; 7] = [
    "FINISHED", "FAILED", "KILLED", "LOST", "ERROR", "DROPPED", "GONE",
];

/// The user key of a task whose command names none.
pub const AGENT_USER: &str = "(agent's task user)";

/// An agent as cost attribution sees it: its name, total resources and price.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentPrice {
    pub name: String,
    pub total: Amounts,
    pub price_per_hour: Option<f64>,
}

impl AgentPrice {
    /// From an `agent_added` / `agent_updated` event or a `/state` agent (`total`,
    /// `attributes.price_per_hour` or `price_per_hour`).
    pub fn from_json(v: &Value) -> AgentPrice {
        let price = v["price_per_hour"].as_f64().or_else(|| {
            v["attributes"][gantry_placement::cost::PRICE_ATTRIBUTE]
                .as_str()
                .and_then(|p| gantry_placement::cost::parse_price(p).ok())
        });
        AgentPrice {
            name: v["name"].as_str().unwrap_or_default().to_string(),
            total: amounts(&v["total"]),
            price_per_hour: price,
        }
    }
}

fn amounts(v: &Value) -> Amounts {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Amounts {
        cpus: f("cpus"),
        mem: f("mem"),
        gpus: f("gpus"),
    }
}

#[derive(Debug, Clone)]
struct OpenTask {
    start: u64,
    role: String,
    framework: String,
    user: String,
    res: Amounts,
    agent: String,
    /// Its cost per millisecond, from the agent's price and shape when it started running
    /// (`None`: not known then; the agent's latest are used).
    rate: Option<f64>,
}

/// One task's use from `start` to `end` (Unix ms), with its cost per millisecond (`None` on
/// an agent without a price).
#[derive(Debug, Clone)]
struct Span {
    start: u64,
    end: u64,
    task: OpenTask,
    cost_per_ms: Option<f64>,
}

/// Walks history events in order: framework names, agents (prices and when they were
/// registered), tasks running.
#[derive(Debug, Default)]
struct Walker {
    frameworks: HashMap<String, String>,
    agents: HashMap<String, AgentPrice>,
    /// Agents registered now, since when.
    alive: HashMap<String, u64>,
    open: HashMap<String, OpenTask>,
    /// Agents the events do not describe (the live state's, for a report).
    fallback: HashMap<String, AgentPrice>,
    /// The first event's time (agents seen only updated were registered before it).
    first_ms: Option<u64>,
}

impl Walker {
    fn agent(&self, id: &str) -> Option<&AgentPrice> {
        self.agents.get(id).or_else(|| self.fallback.get(id))
    }

    fn rate(&self, t: &OpenTask) -> Option<f64> {
        let a = self.agent(&t.agent)?;
        let price = a.price_per_hour?;
        Some(price / 3_600_000.0 * dominant_share(&t.res, &a.total))
    }

    fn span(&self, task: OpenTask, end: u64) -> Span {
        Span {
            start: task.start,
            end,
            cost_per_ms: task.rate.or_else(|| self.rate(&task)),
            task,
        }
    }

    /// Takes one event; a task or an agent that ended is passed on.
    fn feed(
        &mut self,
        h: &HistoryEvent,
        tasks: &mut impl FnMut(Span),
        agents: &mut impl FnMut(&str, u64, u64),
    ) {
        let e = &h.event;
        let first = *self.first_ms.get_or_insert(h.at_unix_ms);
        let id = |k: &str| e[k].as_str().unwrap_or_default().to_string();
        match e["type"].as_str() {
            Some("framework_added") => {
                if let (Some(fid), Some(name)) = (e["framework_id"].as_str(), e["name"].as_str()) {
                    self.frameworks.insert(fid.to_string(), name.to_string());
                }
            }
            Some(t @ ("agent_added" | "agent_updated")) => {
                let aid = id("agent_id");
                // Events from before the agents carried their shape say nothing of it.
                if e.get("total").is_some() {
                    self.agents.insert(aid.clone(), AgentPrice::from_json(e));
                }
                let since = if t == "agent_added" {
                    h.at_unix_ms
                } else {
                    first
                };
                self.alive.entry(aid).or_insert(since);
            }
            Some("agent_removed") => {
                let aid = id("agent_id");
                let since = self.alive.remove(&aid).unwrap_or(first);
                agents(&aid, since, h.at_unix_ms);
            }
            Some("task_updated") => {
                let tid = id("task_id");
                let state = e["state"].as_str().unwrap_or_default();
                if state == "RUNNING" && !self.open.contains_key(&tid) {
                    let fid = e["framework_id"].as_str().unwrap_or_default();
                    let mut task = OpenTask {
                        start: h.at_unix_ms,
                        role: e["role"].as_str().unwrap_or("-").to_string(),
                        framework: self
                            .frameworks
                            .get(fid)
                            .cloned()
                            .unwrap_or_else(|| fid.to_string()),
                        user: e["user"].as_str().unwrap_or(AGENT_USER).to_string(),
                        res: amounts(&e["resources"]),
                        agent: id("agent_id"),
                        rate: None,
                    };
                    task.rate = self.agents.get(&task.agent).and(self.rate(&task));
                    self.open.insert(tid, task);
                } else if TERMINAL.contains(&state) {
                    if let Some(task) = self.open.remove(&tid) {
                        tasks(self.span(task, h.at_unix_ms));
                    }
                }
            }
            _ => {}
        }
    }
}

#[derive(Default)]
struct Row {
    tasks: u64,
    cpu_hours: f64,
    mem_gib_hours: f64,
    gpu_hours: f64,
    cost: f64,
}

/// The usage in `[since_ms, until_ms)` by `by`, from `events` (oldest first); `live_agents`
/// prices agents the events do not describe (by id).
pub fn report(
    events: &[HistoryEvent],
    since_ms: u64,
    until_ms: u64,
    by: UsageBy,
    live_agents: &HashMap<String, AgentPrice>,
) -> Value {
    let mut w = Walker {
        fallback: live_agents.clone(),
        ..Walker::default()
    };
    let mut spans: Vec<Span> = Vec::new();
    let mut agent_spans: Vec<(String, u64, u64)> = Vec::new();
    for h in events {
        w.feed(h, &mut |s| spans.push(s), &mut |a, s, e| {
            agent_spans.push((a.to_string(), s, e))
        });
    }
    let open: Vec<OpenTask> = w.open.values().cloned().collect();
    for t in open {
        spans.push(w.span(t, until_ms));
    }
    let first = w.first_ms.unwrap_or(since_ms);
    for (a, s) in &w.alive {
        agent_spans.push((a.clone(), *s, until_ms));
    }
    for a in live_agents.keys() {
        if !w.alive.contains_key(a) && !agent_spans.iter().any(|(x, _, _)| x == a) {
            agent_spans.push((a.clone(), first, until_ms));
        }
    }
    let clip = |start: u64, end: u64| -> Option<u64> {
        let (s, e) = (start.max(since_ms), end.min(until_ms));
        (e >= s).then(|| e - s)
    };
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut total = Row::default();
    let mut paid: HashMap<&str, f64> = HashMap::new();
    for s in &spans {
        // A task that ran within the window counts, even for no time at all (a task that
        // ends in the millisecond it started: the agent reports both in one batch).
        let Some(ms) = clip(s.start, s.end) else {
            continue;
        };
        let t = &s.task;
        let key = match by {
            UsageBy::Role => &t.role,
            UsageBy::Framework => &t.framework,
            UsageBy::User => &t.user,
        };
        let hours = ms as f64 / 3_600_000.0;
        let cost = s.cost_per_ms.unwrap_or(0.0) * ms as f64;
        *paid.entry(t.agent.as_str()).or_default() += cost;
        for row in [rows.entry(key.clone()).or_default(), &mut total] {
            row.tasks += 1;
            row.cpu_hours += t.res.cpus * hours;
            row.mem_gib_hours += t.res.mem / 1024.0 * hours;
            row.gpu_hours += t.res.gpus * hours;
            row.cost += cost;
        }
    }
    // Idle cost per priced agent: registered time in the window less what its tasks paid.
    let mut idle: BTreeMap<String, (String, f64, f64, f64)> = BTreeMap::new();
    for (a, s, e) in &agent_spans {
        let Some(info) = w.agent(a) else { continue };
        let (Some(price), Some(ms)) = (info.price_per_hour, clip(*s, *e)) else {
            continue;
        };
        let entry = idle
            .entry(a.clone())
            .or_insert_with(|| (info.name.clone(), price, 0.0, 0.0));
        entry.2 += ms as f64 / 3_600_000.0;
        entry.3 += price * ms as f64 / 3_600_000.0;
    }
    let priced = !idle.is_empty() || spans.iter().any(|s| s.cost_per_ms.is_some());
    let row_json = |k: &str, r: &Row| {
        let mut v = json!({"key": k, "tasks": r.tasks, "cpu_hours": r.cpu_hours,
               "mem_gib_hours": r.mem_gib_hours, "gpu_hours": r.gpu_hours});
        if priced {
            v["cost"] = json!(r.cost);
        }
        v
    };
    let mut out = json!({
        "since_ms": since_ms,
        "until_ms": until_ms,
        "by": match by { UsageBy::Role => "role", UsageBy::Framework => "framework", UsageBy::User => "user" },
        "history_from_ms": events.first().map(|e| e.at_unix_ms),
        "rows": rows.iter().map(|(k, r)| row_json(k, r)).collect::<Vec<_>>(),
        "total": row_json("total", &total),
    });
    if priced {
        let mut idle_total = 0.0;
        let agents: Vec<Value> = idle
            .iter()
            .map(|(id, (name, price, hours, cost))| {
                let attributed = paid.get(id.as_str()).copied().unwrap_or(0.0);
                let idle_cost = (cost - attributed).max(0.0);
                idle_total += idle_cost;
                json!({"agent_id": id, "name": name, "price_per_hour": price, "hours": hours,
                       "cost": cost, "attributed": attributed, "idle_cost": idle_cost})
            })
            .collect();
        out["agents"] = Value::Array(agents);
        out["idle_cost"] = json!(idle_total);
    }
    out
}

pub use super::held_offers::{HeldOffers, OFFER_SAMPLE_MS};

/// Series the `gantry_usage_*` counters keep at most; use past them is counted under
/// `role="(other)",framework="(other)",user="(other)"`.
pub const MAX_SERIES: usize = 512;

/// The label set of a usage counter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsageKey {
    pub role: String,
    pub framework: String,
    pub user: String,
}

impl UsageKey {
    fn other() -> UsageKey {
        let o = || "(other)".to_string();
        UsageKey {
            role: o(),
            framework: o(),
            user: o(),
        }
    }
}

/// Task use added up: CPU-, GiB- and GPU-seconds, and cost (price units).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageTotals {
    pub cpu_seconds: f64,
    pub mem_gib_seconds: f64,
    pub gpu_seconds: f64,
    pub cost: f64,
}

impl UsageTotals {
    fn add(&mut self, t: &OpenTask, ms: u64, cost_per_ms: Option<f64>) {
        let secs = ms as f64 / 1000.0;
        self.cpu_seconds += t.res.cpus * secs;
        self.mem_gib_seconds += t.res.mem / 1024.0 * secs;
        self.gpu_seconds += t.res.gpus * secs;
        self.cost += cost_per_ms.unwrap_or(0.0) * ms as f64;
    }
}

/// Task use since the history began, for ever (the `gantry_usage_*_total` counters): fed the
/// events the history records, as they are recorded; never forgets what it added up, so the
/// counters only grow while the master leads.
#[derive(Debug, Default)]
pub struct Meter {
    walker: Walker,
    closed: BTreeMap<UsageKey, UsageTotals>,
    priced: bool,
}

impl Meter {
    /// Adds one recorded event.
    pub fn observe(&mut self, h: &HistoryEvent) {
        let Meter {
            walker,
            closed,
            priced,
        } = self;
        walker.feed(
            h,
            &mut |s: Span| {
                let key = fold(closed, key_of(&s.task));
                *priced |= s.cost_per_ms.is_some();
                closed.entry(key).or_default().add(
                    &s.task,
                    s.end.saturating_sub(s.start),
                    s.cost_per_ms,
                );
            },
            &mut |_, _, _| {},
        );
    }

    /// The framework's name, as the history's events give it (its id when they do not).
    pub fn framework_name(&self, id: &str) -> String {
        self.walker
            .frameworks
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    /// The totals per label set at `now_ms` (running tasks up to then), and whether any
    /// use was priced.
    pub fn counters(&self, now_ms: u64) -> (BTreeMap<UsageKey, UsageTotals>, bool) {
        let mut out = self.closed.clone();
        let mut priced = self.priced;
        for t in self.walker.open.values() {
            let rate = t.rate.or_else(|| self.walker.rate(t));
            priced |= rate.is_some();
            let key = fold(&out, key_of(t));
            out.entry(key)
                .or_default()
                .add(t, now_ms.saturating_sub(t.start), rate);
        }
        (out, priced)
    }
}

fn key_of(t: &OpenTask) -> UsageKey {
    UsageKey {
        role: t.role.clone(),
        framework: t.framework.clone(),
        user: t.user.clone(),
    }
}

/// `key`, or the catch-all once `map` holds [`MAX_SERIES`] others.
fn fold(map: &BTreeMap<UsageKey, UsageTotals>, key: UsageKey) -> UsageKey {
    if map.len() < MAX_SERIES || map.contains_key(&key) {
        key
    } else {
        UsageKey::other()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(at: u64, id: &str, state: &str, role: &str, res: Value) -> HistoryEvent {
        HistoryEvent {
            at_unix_ms: at,
            event: json!({"type": "task_updated", "task_id": id, "state": state, "role": role,
                          "framework_id": "f1", "user": null, "resources": res}),
        }
    }

    #[test]
    fn tasks_count_from_running_to_their_end_clipped_to_the_window() {
        let h = 3_600_000;
        let res = json!({"cpus": 2.0, "mem": 1024.0, "gpus": 1.0});
        let events = vec![
            HistoryEvent {
                at_unix_ms: 0,
                event: json!({"type": "framework_added", "framework_id": "f1", "name": "etl"}),
            },
            task(0, "a", "STAGING", "eng", res.clone()),
            task(h, "a", "RUNNING", "eng", res.clone()),
            task(3 * h, "a", "FINISHED", "eng", res.clone()),
            task(2 * h, "b", "RUNNING", "ml", res.clone()),
            task(2 * h, "b", "RUNNING", "ml", res.clone()),
        ];
        // Window [2h, 4h): a counts 1 h, b (still running) 2 h.
        let r = report(&events, 2 * h, 4 * h, UsageBy::Role, &HashMap::new());
        assert_eq!(r["rows"][0]["key"], "eng");
        assert_eq!(r["rows"][0]["cpu_hours"], 2.0);
        assert_eq!(r["rows"][1]["gpu_hours"], 2.0);
        assert_eq!(r["total"]["mem_gib_hours"], 3.0);
        let r = report(&events, 0, 4 * h, UsageBy::Framework, &HashMap::new());
        assert_eq!(r["rows"][0]["key"], "etl");
        assert_eq!(r["rows"][0]["tasks"], 2);
        assert!(UsageBy::parse("team").is_err());
        // A task that ended in the millisecond it started counts, for no time; one that ended
        // before the window does not.
        let quick = vec![
            task(5 * h, "q", "RUNNING", "eng", res.clone()),
            task(5 * h, "q", "FINISHED", "eng", res.clone()),
            task(h, "old", "RUNNING", "eng", res.clone()),
            task(h + 1, "old", "FINISHED", "eng", res.clone()),
        ];
        let r = report(&quick, 2 * h, 6 * h, UsageBy::Role, &HashMap::new());
        assert_eq!(r["rows"][0]["tasks"], 1, "{r:#}");
        assert_eq!(r["rows"][0]["cpu_hours"], 0.0);
    }

    fn at(at: u64, event: Value) -> HistoryEvent {
        HistoryEvent {
            at_unix_ms: at,
            event,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn tasks_pay_their_dominant_share_and_the_rest_is_idle() {
        let h = 3_600_000;
        let gpu = json!({"cpus": 8.0, "mem": 32768.0, "gpus": 2.0});
        let one_gpu = json!({"cpus": 1.0, "mem": 1024.0, "gpus": 1.0});
        let cpu_heavy = json!({"cpus": 6.0, "mem": 1024.0});
        let mut events = vec![
            at(
                0,
                json!({"type": "agent_added", "agent_id": "a1", "name": "gpu-1",
                         "total": gpu, "price_per_hour": 36.0}),
            ),
            // An agent without a price: its tasks count, for no cost.
            at(
                0,
                json!({"type": "agent_added", "agent_id": "a2", "name": "cpu-1",
                         "total": {"cpus": 4.0, "mem": 4096.0}}),
            ),
        ];
        let t = |at_ms: u64, id: &str, state: &str, role: &str, agent: &str, res: &Value| {
            at(
                at_ms,
                json!({"type": "task_updated", "task_id": id, "state": state,
                "role": role, "framework_id": "f1", "user": "alice", "agent_id": agent,
                "resources": res}),
            )
        };
        events.extend([
            t(0, "g", "RUNNING", "ml", "a1", &one_gpu),
            t(2 * h, "g", "FINISHED", "ml", "a1", &one_gpu),
            t(h, "c", "RUNNING", "etl", "a1", &cpu_heavy),
            t(h, "x", "RUNNING", "etl", "a2", &one_gpu),
            at(
                3 * h,
                json!({"type": "agent_removed", "agent_id": "a1",
                             "name": "gpu-1", "reason": "gone"}),
            ),
            t(3 * h, "c", "LOST", "etl", "a1", &cpu_heavy),
        ]);
        let none = HashMap::new();
        let r = report(&events, 0, 4 * h, UsageBy::Role, &none);
        // g: half the agent for 2 h = 36; c: 6 of 8 CPUs for 2 h = 54.
        assert_eq!(r["rows"][0]["key"], "etl");
        assert!(close(r["rows"][0]["cost"].as_f64().unwrap(), 54.0), "{r:#}");
        assert!(close(r["rows"][1]["cost"].as_f64().unwrap(), 36.0), "{r:#}");
        // The agent existed 3 h (108) and its tasks paid 90: 18 idle.
        assert!(close(r["idle_cost"].as_f64().unwrap(), 18.0), "{r:#}");
        assert_eq!(r["agents"].as_array().unwrap().len(), 1);
        assert!(close(r["agents"][0]["attributed"].as_f64().unwrap(), 90.0));
        // A window of the last hour of the agent: g has ended, c pays 27 of 36.
        let r = report(&events, 2 * h, 3 * h, UsageBy::Framework, &none);
        assert!(close(r["total"]["cost"].as_f64().unwrap(), 27.0), "{r:#}");
        assert!(close(r["idle_cost"].as_f64().unwrap(), 9.0), "{r:#}");
        // Without prices anywhere, no cost fields.
        let unpriced: Vec<HistoryEvent> = events
            .iter()
            .filter(|e| e.event["type"] == "task_updated")
            .cloned()
            .collect();
        let r = report(&unpriced, 0, 4 * h, UsageBy::Role, &none);
        assert!(
            r["total"].get("cost").is_none() && r.get("idle_cost").is_none(),
            "{r:#}"
        );
        // ... unless the live state prices the agent (its events trimmed from the history):
        // it counts from the history's start.
        let live: HashMap<String, AgentPrice> = [(
            "a1".to_string(),
            AgentPrice::from_json(&json!({"name": "gpu-1", "total": gpu,
                                          "attributes": {"price_per_hour": "36"}})),
        )]
        .into();
        let r = report(&unpriced, 0, 4 * h, UsageBy::Role, &live);
        assert!(
            close(r["total"]["cost"].as_f64().unwrap(), 36.0 + 54.0),
            "{r:#}"
        );
        assert!(
            close(r["idle_cost"].as_f64().unwrap(), 4.0 * 36.0 - 90.0),
            "{r:#}"
        );
    }

    #[test]
    fn the_meter_agrees_with_a_report_over_the_whole_history() {
        let h = 3_600_000;
        let events = vec![
            at(
                0,
                json!({"type": "framework_added", "framework_id": "f1", "name": "batch"}),
            ),
            at(
                0,
                json!({"type": "agent_added", "agent_id": "a1", "name": "gpu-1",
                         "total": {"cpus": 8.0, "mem": 8192.0, "gpus": 4.0},
                         "price_per_hour": 8.0}),
            ),
            at(
                h,
                json!({"type": "task_updated", "task_id": "t", "state": "RUNNING",
                         "role": "ml", "framework_id": "f1", "user": null, "agent_id": "a1",
                         "resources": {"cpus": 1.0, "mem": 1024.0, "gpus": 1.0}}),
            ),
            at(
                h,
                json!({"type": "task_updated", "task_id": "u", "state": "RUNNING",
                         "role": "ml", "framework_id": "f1", "user": "bob", "agent_id": "a1",
                         "resources": {"cpus": 4.0, "mem": 1024.0}}),
            ),
            at(
                2 * h,
                json!({"type": "task_updated", "task_id": "t", "state": "FINISHED",
                             "role": "ml", "framework_id": "f1", "user": null,
                             "agent_id": "a1", "resources": {}}),
            ),
        ];
        let mut m = Meter::default();
        for e in &events {
            m.observe(e);
        }
        let (c, priced) = m.counters(3 * h);
        assert!(priced);
        let r = report(&events, 0, 3 * h, UsageBy::Role, &HashMap::new());
        let sum = |f: fn(&UsageTotals) -> f64| c.values().map(f).sum::<f64>();
        assert!(close(
            sum(|t| t.gpu_seconds) / 3600.0,
            r["total"]["gpu_hours"].as_f64().unwrap()
        ));
        assert!(close(
            sum(|t| t.cpu_seconds) / 3600.0,
            r["total"]["cpu_hours"].as_f64().unwrap()
        ));
        assert!(close(sum(|t| t.cost), r["total"]["cost"].as_f64().unwrap()));
        // t: a quarter of the agent for 1 h = 2; u: half of its CPUs for 2 h = 8.
        let key = |user: &str| UsageKey {
            role: "ml".into(),
            framework: "batch".into(),
            user: user.into(),
        };
        assert!(close(c[&key(AGENT_USER)].cost, 2.0), "{c:?}");
        assert!(close(c[&key("bob")].cost, 8.0), "{c:?}");
        // Counters only grow.
        let (later, _) = m.counters(4 * h);
        assert!(later[&key("bob")].cpu_seconds > c[&key("bob")].cpu_seconds);
    }

    #[test]
    fn the_meter_keeps_its_series_bounded() {
        let mut m = Meter::default();
        for i in 0..MAX_SERIES + 10 {
            for (state, at_ms) in [("RUNNING", 0), ("FINISHED", 1000)] {
                m.observe(&at(
                    at_ms,
                    json!({"type": "task_updated", "task_id": format!("t{i}"),
                    "state": state, "role": "r", "framework_id": "f", "user": format!("u{i}"),
                    "agent_id": "a", "resources": {"cpus": 1.0}}),
                ));
            }
        }
        let (c, priced) = m.counters(2000);
        assert!(!priced);
        assert_eq!(c.len(), MAX_SERIES + 1);
        assert!(close(c[&UsageKey::other()].cpu_seconds, 10.0));
    }
}
