//! `gantry-master`: the allocator simulator (`simulate`) and benchmark (`bench`) subcommands.
//! (Serving mode lives on the lead's branch; the subcommands merge in as `Option<Cmd>`.)

use clap::{CommandFactory, Parser};
use gantry_master::simulate;

/// The Gantry master.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Replay a scenario (or a job trace) against the allocator in simulated time.
    Simulate(simulate::SimulateArgs),
    /// Time allocation cycles (Mesos DeclineOffers setup and quota roles).
    Bench(simulate::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Some(Cmd::Simulate(args)) => simulate::run(args)?,
        Some(Cmd::Bench(args)) => simulate::bench::run(args)?,
        None => Cli::command().print_help()?,
    }
    Ok(())
}
