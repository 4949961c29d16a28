//! `gantry-supervise`: the per-task supervisor the agent starts for every task (internal; see
//! `gantry_agent::executor::supervise` for its arguments and what it does). A binary of its own,
//! with nothing but the standard library at run time, so that starting one per task costs little
//! next to re-executing the whole agent.

use std::process::ExitCode;

use gantry_agent::executor::supervise;

fn main() -> ExitCode {
    match supervise::parse_args(std::env::args_os().skip(1)) {
        Ok(spec) => ExitCode::from(u8::try_from(supervise::run(&spec)).unwrap_or(1)),
        Err(e) => {
            eprintln!(
                "gantry-supervise: {e} (started by gantry-agent; not meant to be run by hand)"
            );
            ExitCode::from(2)
        }
    }
}
