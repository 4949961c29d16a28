//! What a load run measured ([`Report`]): the table `gantry-load` prints, its JSON, the
//! accounting check, and accept → RUNNING over the floors ([`TargetRatios`]).

use super::stats::{self, Summary};

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub agents: usize,
    pub frameworks: usize,
    pub gpus_per_agent: usize,
    pub task: String,
    pub task_time_ms: u64,
    /// The arrival rate (tasks per second) in the arrivals mode.
    pub rate: Option<f64>,
    /// Seconds from starting the frameworks to every one subscribed.
    pub subscribe_s: f64,
    /// Tasks that arrived in the frameworks' queues (the arrivals mode) ...
    pub arrived: u64,
    /// ... and of those, still waiting for an offer when the run stopped launching.
    pub waiting_at_end: u64,
    pub window_s: f64,
    pub registration_s: f64,
    pub launched: u64,
    pub running: u64,
    pub finished: u64,
    pub not_finished: u64,
    /// Tasks the master DROPPED (an accept racing a combining accept/decline on the same
    /// agent); not counted in `launched`.
    pub dropped: u64,
    /// `UnknownOffer` answers to such racing accepts/declines (not in `framework_errors`).
    pub stale_offers: u64,
    pub in_flight_at_end: u64,
    pub framework_errors: u64,
    pub framework_reconnects: u64,
    pub frameworks_without_offers: usize,
    pub offers: u64,
    pub declined_offers: u64,
    /// Of those, offers where not one task fitted (declined for `--decline-seconds`).
    pub declined_unfit: u64,
    pub agent_run_tasks: u64,
    pub agent_reconnects: usize,
    pub agent_errors: u64,
    pub launches_per_s: f64,
    pub offer_latency: Summary,
    pub accept_to_running: Summary,
    pub accept_to_staging: Summary,
    pub running_to_ack: Summary,
    pub floor_idle: Summary,
    pub floor_loaded: Summary,
    /// The same ping to an echo server in a process of its own (empty without
    /// [`LoadConfig::echo_exe`](super::LoadConfig::echo_exe)).
    pub floor_xproc_idle: Summary,
    pub floor_xproc_loaded: Summary,
    /// The master's allocation cycles in the launch window (its `/metrics` histogram).
    pub cycles: stats::Cycles,
    pub master_cpu_idle_pct: f64,
    pub master_cpu_load_pct: f64,
    pub harness_cpu_load_pct: f64,
    pub master_rss_idle_mib: f64,
    pub master_rss_peak_mib: f64,
    /// `/proc/loadavg` (1 minute) at the end of the launch window: other work on the machine.
    pub load_average: f64,
    /// UDP datagrams the kernel dropped on full receive buffers from the start of the window to
    /// the end of the drain (machine-wide `RcvbufErrors`).
    pub udp_rcvbuf_errors: u64,
}

/// accept → RUNNING p99 over each floor's p99 (`None`: no samples of one of them). The
/// issue's target is 3× the bare round trip plus the emulated launch, which is nothing here:
/// an emulated agent answers a launch with STARTING and RUNNING at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetRatios {
    pub idle: Option<f64>,
    pub loaded: Option<f64>,
    pub xproc_idle: Option<f64>,
    pub xproc_loaded: Option<f64>,
}

impl TargetRatios {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "in_process_idle": self.idle,
            "in_process_loaded": self.loaded,
            "other_process_idle": self.xproc_idle,
            "other_process_loaded": self.xproc_loaded,
        })
    }
}

/// `2.7x`, or `-` without samples.
fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.1}x"))
}

impl Report {
    /// accept → RUNNING p99 over the p99 of each floor.
    pub fn target_ratios(&self) -> TargetRatios {
        let a = &self.accept_to_running;
        let over = |floor: &Summary| {
            (a.count > 0 && floor.count > 0 && floor.p99_ms > 0.0).then(|| a.p99_ms / floor.p99_ms)
        };
        TargetRatios {
            idle: over(&self.floor_idle),
            loaded: over(&self.floor_loaded),
            xproc_idle: over(&self.floor_xproc_idle),
            xproc_loaded: over(&self.floor_xproc_loaded),
        }
    }

    /// Every launched task finished, none ended otherwise, every framework got offers.
    pub fn accounted(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.launched > 0, "no task was launched");
        anyhow::ensure!(
            self.launched == self.finished && self.not_finished == 0 && self.in_flight_at_end == 0,
            "launched {} but finished {} ({} ended otherwise, {} still in flight)",
            self.launched,
            self.finished,
            self.not_finished,
            self.in_flight_at_end
        );
        anyhow::ensure!(
            self.frameworks_without_offers == 0,
            "{} frameworks got no offer",
            self.frameworks_without_offers
        );
        Ok(())
    }

    pub fn json(&self) -> serde_json::Value {
        let per_k = self.agents as f64 / 1000.0;
        serde_json::json!({
            "agents": self.agents,
            "frameworks": self.frameworks,
            "gpus_per_agent": self.gpus_per_agent,
            "task": self.task,
            "task_time_ms": self.task_time_ms,
            "arrival_rate_per_s": self.rate,
            "subscribe_s": self.subscribe_s,
            "arrived": self.arrived,
            "waiting_at_end": self.waiting_at_end,
            "window_s": self.window_s,
            "registration_s": self.registration_s,
            "tasks": {
                "launched": self.launched,
                "running": self.running,
                "finished": self.finished,
                "not_finished": self.not_finished,
                "dropped": self.dropped,
                "in_flight_at_end": self.in_flight_at_end,
                "agent_run_tasks": self.agent_run_tasks,
            },
            "offers": self.offers,
            "declined_offers": self.declined_offers,
            "declined_unfit": self.declined_unfit,
            "framework_errors": self.framework_errors,
            "stale_offers": self.stale_offers,
            "framework_reconnects": self.framework_reconnects,
            "frameworks_without_offers": self.frameworks_without_offers,
            "agent_reconnects": self.agent_reconnects,
            "agent_errors": self.agent_errors,
            "launches_per_s": self.launches_per_s,
            "offer_latency": self.offer_latency.json(),
            "accept_to_running": self.accept_to_running.json(),
            "accept_to_staging": self.accept_to_staging.json(),
            "running_to_ack": self.running_to_ack.json(),
            "quic_ping_idle": self.floor_idle.json(),
            "quic_ping_loaded": self.floor_loaded.json(),
            "quic_ping_other_process_idle": self.floor_xproc_idle.json(),
            "quic_ping_other_process_loaded": self.floor_xproc_loaded.json(),
            "accept_to_running_p99_over_ping_p99": self.target_ratios().json(),
            "allocation_cycles": {
                "count": self.cycles.count,
                "mean_ms": self.cycles.mean_ms,
                "p50_le_ms": self.cycles.p50_le_ms,
                "p99_le_ms": self.cycles.p99_le_ms,
                "max_le_ms": self.cycles.max_le_ms,
            },
            "master_cpu_idle_pct": self.master_cpu_idle_pct,
            "master_cpu_load_pct": self.master_cpu_load_pct,
            "master_cpu_load_pct_per_1000_agents": self.master_cpu_load_pct / per_k,
            "harness_cpu_load_pct": self.harness_cpu_load_pct,
            "master_rss_idle_mib": self.master_rss_idle_mib,
            "master_rss_peak_mib": self.master_rss_peak_mib,
            "master_rss_peak_mib_per_1000_agents": self.master_rss_peak_mib / per_k,
            "load_average_1m": self.load_average,
            "udp_rcvbuf_errors": self.udp_rcvbuf_errors,
        })
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let per_k = self.agents as f64 / 1000.0;
        let row = |name: &str, s: &Summary| {
            format!(
                "{name:<34} {:>9} {:>9.2} {:>9.2} {:>9.2}\n",
                s.count, s.p50_ms, s.p99_ms, s.max_ms
            )
        };
        let mut t = format!(
            "gantry-load: {} agents ({} GPUs each), {} frameworks, task {} for {} ms, launch window {:.1} s, {}\n",
            self.agents, self.gpus_per_agent, self.frameworks, self.task, self.task_time_ms, self.window_s,
            self.rate.map_or("saturating (launch on every offer)".to_string(), |r| format!("tasks arrive at {r:.0}/s into demand-declaring queues"))
        );
        t += &format!(
            "{:<34} {:>9} {:>9} {:>9} {:>9}\n",
            "latency (ms)", "samples", "p50", "p99", "max"
        );
        let offer_row = if self.rate.is_some() {
            "offer (demanded -> offered)"
        } else {
            "offer (freed -> offered)"
        };
        t += &row(offer_row, &self.offer_latency);
        t += &row("accept -> RUNNING", &self.accept_to_running);
        t += &row("  of which accept -> STAGING", &self.accept_to_staging);
        t += &row("RUNNING -> acknowledged", &self.running_to_ack);
        t += &row("floor: QUIC ping, idle", &self.floor_idle);
        t += &row("floor: QUIC ping, under load", &self.floor_loaded);
        if self.floor_xproc_idle.count > 0 {
            t += &row("floor: ping another process, idle", &self.floor_xproc_idle);
            t += &row("  ... under load", &self.floor_xproc_loaded);
        }
        let r = self.target_ratios();
        t += &format!(
            "accept -> RUNNING p99 over ping p99 (target <= 3x; emulated launch 0): {} under load, {} idle; to another process {} under load, {} idle\n",
            ratio(r.loaded), ratio(r.idle), ratio(r.xproc_loaded), ratio(r.xproc_idle)
        );
        t += &format!(
            "launches/s sustained {:.0}; tasks launched {}, RUNNING {}, FINISHED {}, other end {}, in flight {}, dropped (relaunchable) {}\n",
            self.launches_per_s, self.launched, self.running, self.finished, self.not_finished, self.in_flight_at_end, self.dropped
        );
        if self.rate.is_some() {
            t += &format!(
                "tasks arrived {}, launched {}, still waiting when launching stopped {}\n",
                self.arrived, self.launched, self.waiting_at_end
            );
        }
        t += &format!(
            "offers {} (declined {}, {} of them where no task fitted; stale {}), framework errors {}, framework reconnects {}, frameworks without offers {}, agent reconnects {}\n",
            self.offers, self.declined_offers, self.declined_unfit, self.stale_offers, self.framework_errors, self.framework_reconnects, self.frameworks_without_offers, self.agent_reconnects
        );
        let c = &self.cycles;
        t += &format!(
            "allocation cycles in the window {} (master's /metrics histogram): mean {:.2} ms, p50 <= {} ms, p99 <= {} ms, max <= {} ms\n",
            c.count, c.mean_ms, c.p50_le_ms, c.p99_le_ms, c.max_le_ms
        );
        t += &format!(
            "master CPU {:.0}% idle / {:.0}% under load ({:.1}% per 1,000 agents); RSS {:.0} MiB idle / {:.0} MiB peak ({:.1} MiB per 1,000 agents); harness CPU {:.0}%; registration {:.1} s; load average {:.1}; UDP receive-buffer drops {}\n",
            self.master_cpu_idle_pct, self.master_cpu_load_pct, self.master_cpu_load_pct / per_k,
            self.master_rss_idle_mib, self.master_rss_peak_mib, self.master_rss_peak_mib / per_k,
            self.harness_cpu_load_pct, self.registration_s, self.load_average, self.udp_rcvbuf_errors
        );
        t
    }
}
