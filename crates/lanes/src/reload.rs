//! `lanes reload` and `lanes config`: live reconfiguration of a running `lanes serve` over its
//! status socket, checking a configuration file without starting, and showing the running
//! configuration as a file.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use lanes_iscsi_target::config::ServeConfig;
use serde_json::Value;

/// `lanes reload`: the running server re-reads its --config file and applies the difference.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// Status socket of the running server [default: $LANES_SOCKET or ./lanes-data/lanes.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file without starting anything.
    Check {
        /// The configuration file.
        file: PathBuf,
    },
    /// Print the running server's configuration as a configuration file.
    Show {
        /// Status socket of the running server [default: $LANES_SOCKET or ./lanes-data/lanes.sock].
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
    },
}

fn error_of(reply: &Value) -> Option<&str> {
    reply.get("error").and_then(Value::as_str)
}

pub async fn reload(args: ReloadArgs) -> anyhow::Result<()> {
    let reply = crate::status::request(args.socket, &serde_json::json!({"cmd": "reload"})).await?;
    if let Some(e) = error_of(&reply) {
        anyhow::bail!("reload refused, nothing changed: {e}");
    }
    let file = reply.get("file").and_then(Value::as_str).unwrap_or("-");
    let changes: Vec<&str> = reply
        .get("changes")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if changes.is_empty() {
        println!("reloaded {file}: nothing changed");
        return Ok(());
    }
    println!("reloaded {file}:");
    for change in changes {
        println!("  {change}");
    }
    let count = |key| reply.get(key).and_then(Value::as_u64).unwrap_or(0);
    if count("sessions_ended") > 0 {
        println!(
            "  {} session(s) ended (lost access)",
            count("sessions_ended")
        );
    }
    if count("connections_ended") > 0 {
        println!(
            "  {} connection(s) ended (portal removed)",
            count("connections_ended")
        );
    }
    Ok(())
}

pub async fn config(args: ConfigArgs) -> anyhow::Result<()> {
    match args.command {
        ConfigCommand::Check { file } => {
            let config = ServeConfig::from_toml_file(&file)?;
            let smb = check_smb(&file, &config)?;
            println!("{}: ok: {}{smb}", file.display(), summary(&config));
            Ok(())
        }
        ConfigCommand::Show { socket } => {
            let reply =
                crate::status::request(socket, &serde_json::json!({"cmd": "config"})).await?;
            if let Some(e) = error_of(&reply) {
                anyhow::bail!("{e}");
            }
            let Some(toml) = reply.get("toml").and_then(Value::as_str) else {
                anyhow::bail!("the server did not send its configuration (is it a lanes serve?)");
            };
            if let Some(file) = reply.get("file").and_then(Value::as_str) {
                println!("# running configuration of lanes serve --config {file}");
            }
            print!("{toml}");
            Ok(())
        }
    }
}

/// The SMB part of the file, checked as `lanes serve` and a reload would: each share a
/// directory, the users file readable by its owner only. `, 2 SMB shares, 3 SMB users`, or
/// nothing when the file has no SMB part.
fn check_smb(file: &std::path::Path, config: &ServeConfig) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)?;
    let Some(smb) = lanes_smb_server::SmbConfig::from_file_text(file, &text, &config.data_dir)?
    else {
        return Ok(String::new());
    };
    for (i, share) in smb.shares.iter().enumerate() {
        if !share.path.is_dir() {
            anyhow::bail!(
                "{}: share[{i}].path: {} is not a directory",
                file.display(),
                share.path.display()
            );
        }
    }
    let users = lanes_smb_server::Users::load(&smb.users_file)
        .map_err(|e| anyhow::anyhow!("SMB users: {e}"))?;
    let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    Ok(format!(
        ", {}, {}",
        plural(smb.shares.len(), "SMB share"),
        plural(users.len(), "SMB user")
    ))
}

/// `2 targets, 3 LUNs, 2 portal groups, 3 portals`.
fn summary(config: &ServeConfig) -> String {
    let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    let luns = config.targets.iter().map(|t| t.luns.len()).sum();
    let portals = config.portal_groups.iter().map(|g| g.portals.len()).sum();
    format!(
        "{}, {}, {}, {}",
        plural(config.targets.len(), "target"),
        plural(luns, "LUN"),
        plural(config.portal_groups.len(), "portal group"),
        plural(portals, "portal")
    )
}
