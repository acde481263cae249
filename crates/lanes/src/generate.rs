//! `lanes generate` (for packaging, not in the CLI's help): man pages and shell completions written from the clap definition
//! of the CLI itself, so the packaged documentation never drifts from the flags.
//!
//! `lanes generate man DIR` writes `lanes.1` and one page per subcommand (`lanes-serve.1`,
//! `lanes-lab-up.1`, ...); `lanes generate completions DIR` writes `lanes.bash`, `_lanes` (zsh)
//! and `lanes.fish`. `scripts/build-deb.sh` runs both before `cargo deb`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use clap_complete::Shell;

// Parsed apart from the CLI (main sees `generate` first), so neither the pages nor the
// completions list it: clap_complete would list even a hidden subcommand.
/// Write man pages or shell completions (for packaging).
#[derive(Debug, Parser)]
#[command(name = "lanes generate", bin_name = "lanes generate")]
pub struct GenerateArgs {
    #[command(subcommand)]
    what: Generated,
}

#[derive(Debug, Subcommand)]
enum Generated {
    /// Man pages: lanes(1) and one page per subcommand, written into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Shell completions for bash, zsh and fish, written into DIR.
    Completions {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Writes what was asked for; `command` is the whole CLI (`Cli::command()`).
pub fn run(args: GenerateArgs, command: clap::Command) -> anyhow::Result<()> {
    match args.what {
        Generated::Man { dir } => {
            create(&dir)?;
            man_pages(command, &dir)
        }
        Generated::Completions { dir } => {
            create(&dir)?;
            completions(command, &dir)
        }
    }
}

fn create(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn man_pages(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))?;
    let mut written: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".1"))
        .collect();
    written.sort();
    println!("{}", written.join("\n"));
    Ok(())
}

fn completions(mut command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut command, "lanes", dir)
            .with_context(|| format!("writing {shell} completions into {}", dir.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}
