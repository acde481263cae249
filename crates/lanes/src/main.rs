//! `lanes`: the one binary. Subcommands: `serve` (the iSCSI target), `status`, `alua` and `lab`.

mod attach;
mod banner;
mod bench;
mod doctor;
mod lab;
mod serve;
mod status;

use clap::{Parser, Subcommand, ValueEnum};

/// Multipath network storage: an iSCSI target that exports volumes on every NIC at once.
#[derive(Debug, Parser)]
#[command(name = "lanes", version, about)]
struct Cli {
    /// Log output format (the level comes from RUST_LOG, default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the iSCSI target: every LUN on every portal, ready for dm-multipath.
    Serve(serve::ServeArgs),
    /// Show the sessions and connections of a running `lanes serve`.
    Status(status::StatusArgs),
    /// Change the ALUA state of a portal group of a running `lanes serve`.
    Alua(status::AluaArgs),
    /// Emulated NICs in network namespaces: shaped links, LACP, link and node faults.
    Lab(lab::LabArgs),
    /// Attach a LUN over every path as one multipath device (NBD and/or FUSE export).
    Attach(attach::AttachArgs),
    /// Benchmark an iSCSI target, a file or a block device with the seeds' patterns (IOPS,
    /// MB/s, latency, CPU); `lanes bench chart` draws PNG charts of the results.
    Bench(bench::BenchArgs),
    /// Check a target's portals and paths; print the host configuration that works.
    Doctor(doctor::DoctorArgs),
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One clear line (with its causes), never a backtrace: this is for the operator.
            eprintln!("lanes: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    // Commands that must sleep (cache misses, flushes, FUA) run on the blocking pool; 64
    // threads keep that many disk requests in flight without one thread per queued command.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()?;
    runtime.block_on(async {
        match command {
            Command::Serve(args) => serve::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Alua(args) => status::alua(args).await,
            Command::Lab(args) => lab::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Attach(args) => attach::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
        }
    })
}
