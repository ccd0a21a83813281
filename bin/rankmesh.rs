//! `rankmesh`: the command-line front end. Thin: parsing and printing only.

use clap::{Parser, Subcommand};
use rankmesh::topo::TopoReport;
use rankmesh::{ParallelState, Runtime};
use std::io::Write;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rankmesh",
    version,
    about = "Collective communication runtime for MPI-launched jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show where every rank runs and which TP/SP/DP groups it belongs to.
    Topo {
        /// Tensor-parallel size.
        #[arg(long, default_value_t = 1)]
        tp: usize,
        /// Sequence-parallel size.
        #[arg(long, default_value_t = 1)]
        sp: usize,
        /// Data-parallel size (must equal world size / sp when given).
        #[arg(long)]
        dp: Option<usize>,
        /// Print one JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RANKMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Runs the command; MPI is finalised (the runtime dropped) before returning.
fn run(cli: Cli, rank: &mut Option<usize>) -> rankmesh::Result<()> {
    let rt = Runtime::init()?;
    *rank = Some(rt.rank());
    match cli.command {
        Command::Topo { tp, sp, dp, json } => {
            let mut ps = ParallelState::new(&rt)?;
            ps.initialize_model_parallel(tp, sp, dp)?;
            let report = TopoReport::new(&ps)?;
            if rt.rank() == 0 {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&report).expect("report is plain data")
                    );
                } else {
                    print!("{}", report.table());
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let mut rank = None;
    match run(cli, &mut rank) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let who = rank.map_or(String::new(), |r| format!(" (rank {r})"));
            // One write, so lines of several ranks sharing a terminal do not interleave.
            let line = format!("rankmesh: error{who}: {e}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            ExitCode::FAILURE
        }
    }
}
