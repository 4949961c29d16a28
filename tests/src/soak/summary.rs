//! The soak's report: the injected faults with their recovery times, what ran against what
//! the framework was told, and what was left behind.

use std::time::Duration;

use super::{Book, FaultKind, Ledger, Leftovers, Reconciled, SoakSpec};

/// One injected fault and how long the cluster took to recover from it.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub target: String,
    /// Since the soak began.
    pub at: Duration,
    /// Units finished when it was injected, and tasks RUNNING then (leader's `/state`).
    pub finished_before: usize,
    pub running: usize,
    /// How long the fault itself lasted (a pause, etcd down, framework down).
    pub outage: Duration,
    /// From the end of the outage (the restart, the `SIGCONT`) until the cluster was whole
    /// again: one leader, every agent registered, the framework subscribed, no task
    /// UNREACHABLE.
    pub recovery: Duration,
    pub note: String,
}

/// Everything the soak's report shows.
pub struct Report<'a> {
    pub seed: u64,
    pub spec: &'a SoakSpec,
    pub faults: &'a [FaultRecord],
    pub book: &'a Book,
    pub ledger: &'a Ledger,
    pub reconciled: &'a Reconciled,
    pub leftovers: &'a Leftovers,
    pub elapsed: Duration,
}

/// The soak's report, as printed.
pub fn report(rep: &Report<'_>) -> String {
    let Report {
        seed,
        spec,
        faults,
        book,
        ledger,
        reconciled: r,
        leftovers,
        elapsed,
    } = rep;
    let mut s = String::new();
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "==== soak report: seed {seed}, {} units, {} faults, {:.1} s ====",
        spec.units,
        faults.len(),
        elapsed.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "{:>3} {:>7}  {:<19} {:<12} {:>8} {:>7} {:>8} {:>9}  note",
        "#", "at s", "fault", "target", "done", "running", "outage s", "recover s"
    );
    for (i, f) in faults.iter().enumerate() {
        let _ = writeln!(
            s,
            "{:>3} {:>7.1}  {:<19} {:<12} {:>8} {:>7} {:>8.1} {:>9.2}  {}",
            i + 1,
            f.at.as_secs_f64(),
            f.kind.name(),
            f.target,
            f.finished_before,
            f.running,
            f.outage.as_secs_f64(),
            f.recovery.as_secs_f64(),
            f.note
        );
    }
    let _ = writeln!(s, "recovery by fault kind (count, mean s, max s):");
    for k in FaultKind::ALL {
        let rs: Vec<f64> = faults
            .iter()
            .filter(|f| f.kind == k)
            .map(|f| f.recovery.as_secs_f64())
            .collect();
        if rs.is_empty() {
            continue;
        }
        let max = rs.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "  {:<19} {:>3} {:>7.2} {:>7.2}",
            k.name(),
            rs.len(),
            rs.iter().sum::<f64>() / rs.len() as f64,
            max
        );
    }
    let _ = writeln!(
        s,
        "tasks executed (ledger done lines): {}  distinct task ids: {}  ledger lines: {}",
        r.executions, r.distinct_tasks, ledger.lines
    );
    let _ = writeln!(
        s,
        "launched: {}  FINISHED units: {}/{}  lost+relaunched: {}  dropped+relaunched: {}  \
         failed: {}  UNREACHABLE updates: {}  resumed from UNREACHABLE: {}  re-subscriptions: {}",
        book.launched,
        book.finished.len(),
        spec.units,
        book.lost.len(),
        book.dropped.len(),
        book.failures.len(),
        book.unreachable_updates,
        book.resumed,
        book.registrations.len().saturating_sub(1)
    );
    let list = |s: &mut String, what: &str, v: &[String]| {
        let _ = writeln!(s, "{what}: {}", v.len());
        for x in v.iter().take(20) {
            let _ = writeln!(s, "    {x}");
        }
        if v.len() > 20 {
            let _ = writeln!(s, "    ... {} more", v.len() - 20);
        }
    };
    list(&mut s, "task ids executed twice", &r.task_twice);
    list(&mut s, "never executed", &r.never_executed);
    list(
        &mut s,
        "units executed twice after a loss (allowed: LOST/GONE is relaunched)",
        &r.unit_twice_after_loss,
    );
    list(
        &mut s,
        "units executed twice otherwise",
        &r.unit_twice_unexplained,
    );
    list(
        &mut s,
        "tasks started, not done (killed mid-way)",
        &r.started_not_done,
    );
    let lost: Vec<String> = book
        .lost
        .iter()
        .map(|(t, st, m)| {
            let name = book.attempts.get(t).map_or("?", |a| a.name.as_str());
            format!("{name} {t} {st}: {m}")
        })
        .collect();
    list(&mut s, "lost by the cluster", &lost);
    let fails: Vec<String> = book
        .failures
        .iter()
        .map(|(t, st, m)| format!("{t} {st}: {m}"))
        .collect();
    list(&mut s, "failures", &fails);
    list(
        &mut s,
        "accepts that raced a rescind (UnknownOffer; tasks DROPPED, launched again)",
        &book.offer_races,
    );
    list(&mut s, "anomalies", &book.anomalies);
    let mut other = r.unknown.clone();
    other.extend(r.inconsistent.iter().cloned());
    other.extend(ledger.malformed.iter().cloned());
    list(&mut s, "ledger inconsistencies", &other);
    let _ = writeln!(
        s,
        "leftovers: {} task processes, {} task cgroups, {} sandboxes (launched {}, started {})",
        leftovers.processes.len(),
        leftovers.cgroups.len(),
        leftovers.sandboxes,
        book.launched,
        leftovers.started
    );
    for p in leftovers.processes.iter().take(10) {
        let _ = writeln!(s, "    process {p}");
    }
    for c in leftovers.cgroups.iter().take(10) {
        let _ = writeln!(s, "    cgroup {c}");
    }
    s
}
