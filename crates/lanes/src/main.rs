//! `lanes`: the one binary. Subcommands: `serve` (the iSCSI target and, with `[[share]]`
//! sections, the SMB server), `status`, `alua`, `reload`, `config`, `lab`, `attach`, `bench`,
//! `doctor` and `smb`; and `generate` (man pages, completions) for
//! packaging.

mod attach;
mod banner;
mod bench;
mod doctor;
mod generate;
mod lab;
mod notify;
mod reload;
mod serve;
mod smb;
mod status;
mod status_smb;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

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
    /// Make a running `lanes serve` re-read its --config file and apply the difference.
    Reload(reload::ReloadArgs),
    /// Check a configuration file, or show the running configuration as one.
    Config(reload::ConfigArgs),
    /// Emulated NICs in network namespaces: shaped links, LACP, link and node faults.
    Lab(lab::LabArgs),
    /// Attach a LUN over every path as one multipath device (NBD and/or FUSE export).
    Attach(attach::AttachArgs),
    /// Benchmark an iSCSI target, a file or a block device with the seeds' patterns (IOPS,
    /// MB/s, latency, CPU); `lanes bench chart` draws PNG charts of the results.
    Bench(bench::BenchArgs),
    /// Check a target's portals and paths; print the host configuration that works.
    Doctor(doctor::DoctorArgs),
    /// SMB file shares: manage the users file (`lanes smb user add NAME`).
    Smb(smb::SmbArgs),
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

/// Keeps glibc from handing large freed blocks back to the kernel at once. The initiator reads
/// responses into 1 MiB buffers that live on as long as a caller holds a piece of them; with
/// glibc's defaults each such buffer is a fresh `mmap` whose pages fault in again while `recv`
/// copies into them (3-17 page faults per 128 KiB read, a quarter of the client's CPU, measured
/// with perf; docs/BENCHMARKS.md). From the heap, and with freed memory kept up to 64 MiB, they
/// are reused warm.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_allocator() {
    // SAFETY: mallopt only sets glibc allocator parameters; it is called once, first thing in
    // main, before any other thread exists, and its arguments are plain integers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn main() -> std::process::ExitCode {
    tune_allocator();
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|first| first == "generate") {
        // Packaging only: outside `Cli`, so the generated pages and completions omit it.
        return report(generate::run(
            generate::GenerateArgs::parse_from(std::env::args_os().skip(1)),
            Cli::command(),
        ));
    }
    let cli = Cli::parse();
    init_logging(cli.log_format);
    report(run(cli.command))
}

fn report(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
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
            Command::Reload(args) => reload::reload(args).await,
            Command::Config(args) => reload::config(args).await,
            Command::Lab(args) => lab::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Attach(args) => attach::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            Command::Smb(args) => smb::run(args),
        }
    })
}
