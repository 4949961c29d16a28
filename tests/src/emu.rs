//! Pieces shared by everything that emulates many peers in one process (the `gantry-load`
//! harness and the `ha_agents` failover benchmark): client UDP sockets with large buffers,
//! per-agent certificates issued from the dev TLS directory, and `/proc` readings of a
//! process's CPU time and resident memory.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::PeerIdentity;

/// A client endpoint on loopback with a large receive buffer (it carries many peers'
/// connections).
pub fn client_endpoint() -> anyhow::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    socket2::SockRef::from(&socket).set_recv_buffer_size(8 << 20)?;
    let runtime = quinn::default_runtime().context("no tokio runtime")?;
    Ok(quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        runtime,
    )?)
}

/// Issues (or loads) the certificates of agents `{prefix}-0` .. `{prefix}-{n-1}` from the CA in
/// `tls_dir` on two threads; returns their QUIC client configurations, in order.
pub fn agent_configs(
    tls_dir: &Path,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Vec<quinn::ClientConfig>> {
    let chunks: Vec<Vec<usize>> = (0..n)
        .collect::<Vec<_>>()
        .chunks(n.div_ceil(2).max(1))
        .map(|c| c.to_vec())
        .collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|idxs| {
            let dir = tls_dir.to_path_buf();
            let prefix = prefix.to_string();
            std::thread::spawn(move || -> anyhow::Result<Vec<quinn::ClientConfig>> {
                idxs.into_iter()
                    .map(|i| {
                        let m = gantry_pki::load_or_issue(
                            &dir,
                            &PeerIdentity::Agent(format!("{prefix}-{i}")),
                            &[],
                        )?;
                        Ok(quic::client_config(&m)?)
                    })
                    .collect()
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.extend(h.join().map_err(|_| anyhow::anyhow!("issuer thread"))??);
    }
    Ok(out)
}

/// CPU time (user + system) a process (`"self"` or a pid) has used so far, from
/// `/proc/PID/stat`; zero when it cannot be read.
pub fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime and stime are the 12th and
    // 13th of them, in clock ticks.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no memory effects; it only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Resident memory (`VmRSS`) of a process in KiB, from `/proc/PID/status`; zero when unknown.
pub fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The machine's UDP receive-buffer overflows so far (`RcvbufErrors` in `/proc/net/snmp`):
/// datagrams the kernel dropped because a socket's receive buffer was full. Machine-wide, so a
/// difference over a run also counts other processes' sockets.
pub fn udp_rcvbuf_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
