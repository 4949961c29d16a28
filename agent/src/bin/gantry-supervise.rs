//! `gantry-supervise --server`: the agent's supervisor process, which starts, waits for and
//! records every task of one agent run (internal; see `gantry_agent::executor::server`). A
//! binary of its own, with nothing but the standard library at run time: small to start, and
//! small in memory while it outlives a restarting agent.

use std::process::ExitCode;

use gantry_agent::executor::server;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "--server") {
        return ExitCode::from(u8::try_from(server::serve()).unwrap_or(1));
    }
    eprintln!("gantry-supervise: started by gantry-agent as `gantry-supervise --server`; not meant to be run by hand");
    ExitCode::from(2)
}
