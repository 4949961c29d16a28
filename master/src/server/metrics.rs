//! `GET /metrics`: the master in the Prometheus text format (OpenMetrics), rendered with
//! `prometheus-client` from the core's pure [`MetricsSnapshot`] plus what only the shell
//! measures (the allocation cycle time). docs/operations.md lists every series.
//!
//! A standby (or a master whose core has not recovered yet) serves `gantry_leader 0` and the
//! cycle histogram only, so Prometheus can scrape every master and alert on "no leader".

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::state::metrics::MetricsSnapshot;

/// The content type Prometheus asks for and `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

/// What the shell measures itself, kept across scrapes.
#[derive(Clone)]
pub struct ShellMetrics {
    /// Seconds each allocation cycle took.
    pub allocation_cycle: Histogram,
}

impl Default for ShellMetrics {
    fn default() -> Self {
        Self {
            // 10 µs .. ~10 s.
            allocation_cycle: Histogram::new(exponential_buckets(0.000_01, 4.0, 11)),
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The operator port's own figures (docs/security.md, "Operator port limits"); every master
/// serves them, leading or not.
#[derive(Debug, Clone, Copy, Default)]
pub struct OperatorPortFigures {
    /// Connections open, and how many of them are not authenticated.
    pub connections: usize,
    pub unauthenticated: usize,
    /// Unauthenticated connections closed to make room, since start.
    pub closed_for_room: u64,
    pub event_subscribers: usize,
    pub sessions: usize,
    /// Addresses with recent failed authentications.
    pub auth_limited_addresses: usize,
    /// Failed authentications, and attempts answered 429, since start.
    pub auth_failures: u64,
    pub auth_refused: u64,
}

fn register_port(reg: &mut Registry, p: &OperatorPortFigures) {
    let conns = Family::<Labels, Gauge>::default();
    conns
        .get_or_create(&labels(&[("state", "authenticated")]))
        .set(p.connections.saturating_sub(p.unauthenticated) as i64);
    conns
        .get_or_create(&labels(&[("state", "unauthenticated")]))
        .set(p.unauthenticated as i64);
    reg.register(
        "operator_connections",
        "Operator API connections open",
        conns,
    );
    let counter = |n: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(n);
        c
    };
    reg.register(
        "operator_connections_closed_for_room",
        "Unauthenticated operator API connections closed to make room for new ones",
        counter(p.closed_for_room),
    );
    reg.register(
        "operator_auth_failures",
        "Failed operator authentications (wrong token, dashboard login)",
        counter(p.auth_failures),
    );
    reg.register(
        "operator_auth_rate_limited",
        "Authentication attempts answered 429 (too many failures from the address)",
        counter(p.auth_refused),
    );
    let gauge = |n: usize| {
        let g = Gauge::<i64>::default();
        g.set(n as i64);
        g
    };
    reg.register(
        "operator_event_subscribers",
        "Open /api/v1/events streams",
        gauge(p.event_subscribers),
    );
    reg.register(
        "operator_sessions",
        "Dashboard sessions held",
        gauge(p.sessions),
    );
}

/// The usage counters' values: per label set, and whether any use was priced
/// ([`super::usage::Meter::counters`]).
pub type UsageSeries = (
    std::collections::BTreeMap<super::usage::UsageKey, super::usage::UsageTotals>,
    bool,
);

/// Renders the exposition: `snapshot` is `None` when this master does not lead; `usage` is the
/// history's task use (none when the history is off).
pub fn render(
    shell: &ShellMetrics,
    snapshot: Option<&MetricsSnapshot>,
    port: &OperatorPortFigures,
    usage: Option<&UsageSeries>,
) -> String {
    let mut reg = Registry::with_prefix("gantry");
    register_port(&mut reg, port);
    reg.register(
        "allocation_cycle_seconds",
        "Time one allocation cycle took",
        shell.allocation_cycle.clone(),
    );
    let leader = Gauge::<i64>::default();
    leader.set(i64::from(snapshot.is_some()));
    reg.register("leader", "1 when this master leads the cluster", leader);
    if let Some(s) = snapshot {
        register_snapshot(&mut reg, s);
        if let Some(u) = usage {
            register_usage(&mut reg, u);
        }
    }
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &reg) {
        tracing::warn!("metrics encoding failed: {e}");
    }
    text
}

/// `gantry_usage_*_total{role,framework,user}`: resources used by tasks (from `RUNNING` to
/// their end, never offers held) and their cost, the figures `/api/v1/usage` reports. At most
/// [`super::usage::MAX_SERIES`] label sets, then `(other)`.
fn register_usage(reg: &mut Registry, (series, priced): &UsageSeries) {
    type Pick = fn(&super::usage::UsageTotals) -> f64;
    let mut kinds: Vec<(&str, &str, Pick)> = vec![
        (
            "usage_gpu_seconds",
            "GPUs used by tasks integrated over time (GPU-seconds), by role, framework and user",
            |t| t.gpu_seconds,
        ),
        (
            "usage_cpu_seconds",
            "CPUs held by running tasks integrated over time (CPU-seconds), by role, framework and user",
            |t| t.cpu_seconds,
        ),
        (
            "usage_mem_gib_seconds",
            "Memory held by running tasks integrated over time (GiB-seconds), by role, framework and user",
            |t| t.mem_gib_seconds,
        ),
    ];
    if *priced {
        kinds.push((
            "usage_cost",
            "What tasks cost: their dominant share of their agent's price_per_hour × time, by role, framework and user",
            |t| t.cost,
        ));
    }
    for (name, help, pick) in kinds {
        let fam = Family::<Labels, FloatCounter>::default();
        for (k, t) in series {
            fam.get_or_create(&labels(&[
                ("role", &k.role),
                ("framework", &k.framework),
                ("user", &k.user),
            ]))
            .inc_by(pick(t));
        }
        reg.register(name, help, fam);
    }
}

fn register_snapshot(reg: &mut Registry, s: &MetricsSnapshot) {
    let a = &s.allocator;
    let offers = Family::<Labels, Counter>::default();
    for (result, n) in [
        ("made", a.offers_made),
        ("accepted", a.offers_accepted),
        ("declined", a.offers_declined),
        ("rescinded", a.offers_rescinded),
        ("expired", a.offers_expired),
    ] {
        offers
            .get_or_create(&labels(&[("result", result)]))
            .inc_by(n);
    }
    reg.register(
        "offers",
        "Offers by what became of them (rescinded includes expired)",
        offers,
    );
    let outstanding = Gauge::<i64>::default();
    outstanding.set(a.offers_outstanding as i64);
    reg.register(
        "offers_outstanding",
        "Offers made and not yet answered",
        outstanding,
    );
    let cycles = Counter::<u64>::default();
    cycles.inc_by(a.allocation_cycles);
    reg.register("allocation_cycles", "Allocation cycles run", cycles);
    let visits = Counter::<u64>::default();
    visits.inc_by(a.agent_visits);
    reg.register(
        "allocation_agent_visits",
        "Agents whose frameworks allocation cycles walked (the rest were passed over)",
        visits,
    );

    let role_share = Family::<Labels, FloatGauge>::default();
    let weight = Family::<Labels, FloatGauge>::default();
    let quota = Family::<Labels, FloatGauge>::default();
    let role_alloc = Family::<Labels, FloatGauge>::default();
    for (role, m) in &a.roles {
        for (kind, milli) in m.allocated.iter() {
            role_alloc
                .get_or_create(&labels(&[("role", role), ("kind", kind)]))
                .set(milli as f64 / 1000.0);
        }
        role_share
            .get_or_create(&labels(&[("role", role)]))
            .set(m.dominant_share);
        weight
            .get_or_create(&labels(&[("role", role)]))
            .set(m.weight);
        if let Some(g) = &m.quota_guarantee {
            for (kind, milli) in g.iter() {
                quota
                    .get_or_create(&labels(&[
                        ("role", role),
                        ("kind", kind),
                        ("kind_of", "guarantee"),
                    ]))
                    .set(milli as f64 / 1000.0);
            }
        }
        if let Some(l) = &m.quota_limit {
            for (kind, milli) in l.iter() {
                quota
                    .get_or_create(&labels(&[
                        ("role", role),
                        ("kind", kind),
                        ("kind_of", "limit"),
                    ]))
                    .set(milli as f64 / 1000.0);
            }
        }
    }
    reg.register(
        "role_dominant_share",
        "Dominant share of the role's subtree (offered + in use), divided by its weight",
        role_share,
    );
    reg.register("role_weight", "The role's weight", weight);
    reg.register(
        "role_allocated",
        "Resources allocated to the role's subtree (offered + in use) by kind",
        role_alloc,
    );
    reg.register(
        "quota",
        "Quota per role and resource kind (kind_of: guarantee or limit)",
        quota,
    );

    let fw_share = Family::<Labels, FloatGauge>::default();
    for f in &s.framework_shares {
        fw_share
            .get_or_create(&labels(&[
                ("framework", &f.name),
                ("framework_id", &f.id),
                ("role", &f.role),
            ]))
            .set(f.share);
    }
    reg.register(
        "framework_dominant_share",
        "Dominant share of the cluster a framework holds in a role (offered + in use)",
        fw_share,
    );

    for (name, help, by_state) in [
        (
            "tasks",
            "Tasks the master tracks (not yet completed), by state",
            &s.tasks,
        ),
        ("agents", "Agents by state", &s.agents),
        ("frameworks", "Frameworks by state", &s.frameworks),
    ] {
        let fam = Family::<Labels, Gauge>::default();
        for (state, n) in by_state {
            fam.get_or_create(&labels(&[("state", state)]))
                .set(*n as i64);
        }
        reg.register(name, help, fam);
    }

    let resources = Family::<Labels, FloatGauge>::default();
    for (state, r) in &s.resources {
        for (kind, milli) in r.iter() {
            resources
                .get_or_create(&labels(&[("kind", kind), ("state", state)]))
                .set(milli as f64 / 1000.0);
        }
    }
    // Kinds the cluster has show 0 in every state rather than no series.
    if let Some(total) = s.resources.get("total") {
        for (kind, _) in total.iter() {
            for state in s.resources.keys() {
                let _ = resources.get_or_create(&labels(&[("kind", kind), ("state", state)]));
            }
        }
    }
    reg.register(
        "resources",
        "Resources over all agents by kind and state (total, offered, used, reserved)",
        resources,
    );

    let completed = Family::<Labels, Counter>::default();
    for (state, n) in &s.tasks_completed {
        completed
            .get_or_create(&labels(&[("state", state)]))
            .inc_by(*n);
    }
    reg.register(
        "tasks_completed",
        "Tasks completed (ended and acknowledged) by final state",
        completed,
    );

    let retries = Counter::<u64>::default();
    retries.inc_by(s.status_update_retries);
    reg.register(
        "status_update_retries",
        "Status updates agents sent again that the master already had",
        retries,
    );

    let by_role = Family::<Labels, FloatCounter>::default();
    let by_fw = Family::<Labels, FloatCounter>::default();
    for rs in &s.resource_seconds {
        for (kind, secs) in &rs.seconds {
            match &rs.framework {
                None => {
                    by_role
                        .get_or_create(&labels(&[("role", &rs.role), ("kind", kind)]))
                        .inc_by(*secs);
                }
                Some((id, name)) => {
                    by_fw
                        .get_or_create(&labels(&[
                            ("framework", name),
                            ("framework_id", id),
                            ("role", &rs.role),
                            ("kind", kind),
                        ]))
                        .inc_by(*secs);
                }
            }
        }
    }
    // Allocated is offered + in use (what fairness counts), not use: named so, apart from
    // the `usage_*` counters.
    reg.register(
        "role_allocated_seconds",
        "Resources allocated to the role's subtree (offered + in use, not use alone) integrated over time (e.g. GPU-seconds)",
        by_role,
    );
    reg.register(
        "framework_allocated_seconds",
        "Resources allocated to a framework in a role (offered + in use) integrated over time",
        by_fw,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::metrics::FrameworkShare;

    #[test]
    fn series_have_the_names_operators_expect() {
        let shell = ShellMetrics::default();
        shell.allocation_cycle.observe(0.002);
        let port = OperatorPortFigures {
            connections: 5,
            unauthenticated: 2,
            closed_for_room: 7,
            auth_failures: 11,
            auth_refused: 3,
            ..OperatorPortFigures::default()
        };
        let standby = render(&shell, None, &port, None);
        for line in [
            "gantry_operator_connections{state=\"authenticated\"} 3",
            "gantry_operator_connections{state=\"unauthenticated\"} 2",
            "gantry_operator_connections_closed_for_room_total 7",
            "gantry_operator_auth_failures_total 11",
            "gantry_operator_auth_rate_limited_total 3",
            "gantry_operator_event_subscribers 0",
        ] {
            assert!(standby.contains(line), "missing {line:?} in\n{standby}");
        }
        assert!(standby.contains("gantry_leader 0"), "{standby}");
        assert!(
            standby.contains("gantry_allocation_cycle_seconds_count 1"),
            "{standby}"
        );
        assert!(!standby.contains("gantry_tasks"), "{standby}");

        let mut s = MetricsSnapshot::default();
        s.allocator.offers_made = 3;
        s.tasks.insert("RUNNING", 2);
        s.resources.insert(
            "total",
            gantry_proto::Resources::parse("cpus:4;gpus:2").unwrap(),
        );
        s.resources.insert("used", gantry_proto::Resources::new());
        s.framework_shares.push(FrameworkShare {
            id: "fw-1".into(),
            name: "train".into(),
            role: "ml".into(),
            share: 0.5,
        });
        s.resource_seconds.push(crate::allocator::ResourceSeconds {
            role: "ml".into(),
            framework: None,
            seconds: [("gpus".to_string(), 7200.0)].into(),
        });
        s.status_update_retries = 4;
        let usage: UsageSeries = (
            [(
                crate::server::usage::UsageKey {
                    role: "ml".into(),
                    framework: "train".into(),
                    user: "alice".into(),
                },
                crate::server::usage::UsageTotals {
                    gpu_seconds: 3600.0,
                    cost: 2.5,
                    ..Default::default()
                },
            )]
            .into(),
            true,
        );
        let text = render(&shell, Some(&s), &port, Some(&usage));
        for line in [
            "gantry_leader 1",
            "gantry_offers_total{result=\"made\"} 3",
            "gantry_offers_total{result=\"expired\"} 0",
            "gantry_tasks{state=\"RUNNING\"} 2",
            "gantry_resources{kind=\"gpus\",state=\"total\"} 2.0",
            "gantry_resources{kind=\"gpus\",state=\"used\"} 0.0",
            "gantry_framework_dominant_share{framework=\"train\",framework_id=\"fw-1\",role=\"ml\"} 0.5",
            "gantry_role_allocated_seconds_total{role=\"ml\",kind=\"gpus\"} 7200.0",
            "gantry_usage_gpu_seconds_total{role=\"ml\",framework=\"train\",user=\"alice\"} 3600.0",
            "gantry_usage_cost_total{role=\"ml\",framework=\"train\",user=\"alice\"} 2.5",
            "gantry_status_update_retries_total 4",
            "# TYPE gantry_allocation_cycle_seconds histogram",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
