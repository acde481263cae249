//! SMB in the lanes binary: `lanes smb user add`, and starting the SMB server from
//! `lanes serve` when the configuration file has `[[share]]` sections.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use lanes_smb_server::{SmbConfig, SmbServer, Users};

#[derive(Debug, Args)]
pub struct SmbArgs {
    #[command(subcommand)]
    command: SmbCommand,
}

#[derive(Debug, Subcommand)]
enum SmbCommand {
    /// Manage the SMB users file (name:NT-hash lines, mode 0600).
    #[command(subcommand)]
    User(UserCommand),
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Add a user, or set a user's password: read from --password-file, else from the terminal
    /// (asked twice) or the first line of standard input.
    Add(UserAddArgs),
}

#[derive(Debug, Args)]
struct UserAddArgs {
    /// The user name clients log on with.
    name: String,
    /// Read the password from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// The users file [default: [smb] users-file of --config, else <data-dir>/smb-users].
    #[arg(long, value_name = "FILE")]
    users_file: Option<PathBuf>,
    /// The lanes configuration file, for its users-file and data-dir.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory of the default users file [default: ./lanes-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

pub fn run(args: SmbArgs) -> anyhow::Result<()> {
    match args.command {
        SmbCommand::User(UserCommand::Add(a)) => user_add(a),
    }
}

fn user_add(a: UserAddArgs) -> anyhow::Result<()> {
    let path = match a.users_file {
        Some(p) => p,
        None => {
            let overrides = lanes_iscsi_target::config::CliOverrides {
                config: a.config.clone(),
                data_dir: a.data_dir.clone(),
                ..Default::default()
            };
            let serve = lanes_iscsi_target::config::ServeConfig::from_cli(&overrides)?;
            let mut users_file = serve.data_dir.join("smb-users");
            if let Some(file) = &a.config {
                let text =
                    std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
                if let Some(c) = SmbConfig::from_file_text(file, &text, &serve.data_dir)? {
                    users_file = c.users_file;
                }
            }
            users_file
        }
    };
    let password = read_password(a.password_file.as_deref())?;
    if password.is_empty() {
        anyhow::bail!("empty password");
    }
    Users::add_to_file(&path, &a.name, &password)?;
    println!("user {} set in {}", a.name, path.display());
    Ok(())
}

fn read_password(file: Option<&Path>) -> anyhow::Result<String> {
    if let Some(f) = file {
        let text = std::fs::read_to_string(f).with_context(|| f.display().to_string())?;
        return Ok(text.lines().next().unwrap_or("").to_string());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        return Ok(line.trim_end_matches(['\r', '\n']).to_string());
    }
    let first = prompt_hidden("Password: ")?;
    let second = prompt_hidden("Again: ")?;
    if first != second {
        anyhow::bail!("the passwords differ");
    }
    Ok(first)
}

/// Reads one line from the terminal with echo off.
fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let stdin = std::io::stdin();
    eprint!("{prompt}");
    std::io::stderr().flush()?;
    let saved = tcgetattr(&stdin)?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    tcsetattr(&stdin, OptionalActions::Now, &quiet)?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    tcsetattr(&stdin, OptionalActions::Now, &saved)?;
    eprintln!();
    read?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Starts the SMB server when `config_file` has shares; None otherwise.
pub async fn start_for_serve(
    config_file: Option<&Path>,
    data_dir: &Path,
) -> anyhow::Result<Option<(SmbServer, SmbConfig)>> {
    let Some(file) = config_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let Some(cfg) = SmbConfig::from_file_text(file, &text, data_dir)? else {
        return Ok(None);
    };
    let users = Users::load(&cfg.users_file).with_context(|| {
        format!(
            "SMB users (add one with `lanes smb user add NAME --users-file {}`)",
            cfg.users_file.display()
        )
    })?;
    if users.is_empty() {
        tracing::warn!(
            "{}: no SMB users; nobody can connect",
            cfg.users_file.display()
        );
    }
    let configured = cfg.clone();
    Ok(Some((SmbServer::start(cfg, users).await?, configured)))
}

/// The SMB server's part of a reload (`lanes reload`, SIGHUP): its shares and users from the
/// same file, applied live; settings that need a restart are refused with their key. With no
/// SMB server running, a file that now has shares is refused the same way.
pub struct SmbReload {
    server: Option<std::sync::Arc<lanes_smb_server::state::Server>>,
    data_dir: PathBuf,
    /// The configuration applied last, as configured (ports as written, not as bound).
    applied: std::sync::Arc<std::sync::Mutex<Option<SmbConfig>>>,
}

impl SmbReload {
    pub fn new(running: Option<(&SmbServer, SmbConfig)>, data_dir: &Path) -> SmbReload {
        let (server, applied) = match running {
            Some((s, c)) => (Some(s.server.clone()), Some(c)),
            None => (None, None),
        };
        SmbReload {
            server,
            data_dir: data_dir.to_path_buf(),
            applied: std::sync::Arc::new(std::sync::Mutex::new(applied)),
        }
    }
}

struct PreparedSmb {
    inner: lanes_smb_server::PreparedReload,
    config: SmbConfig,
    applied: std::sync::Arc<std::sync::Mutex<Option<SmbConfig>>>,
}

impl lanes_iscsi_target::PreparedSection for PreparedSmb {
    fn changes(&self) -> Vec<String> {
        self.inner.changes().to_vec()
    }
    fn commit(self: Box<Self>) {
        let PreparedSmb {
            inner,
            config,
            applied,
        } = *self;
        inner.commit();
        let mut slot = applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(config);
    }
}

/// Nothing to change: the file has no SMB part and none runs.
struct Unchanged;

impl lanes_iscsi_target::PreparedSection for Unchanged {
    fn changes(&self) -> Vec<String> {
        Vec::new()
    }
    fn commit(self: Box<Self>) {}
}

impl lanes_iscsi_target::ReloadSection for SmbReload {
    fn prepare(&self, file: &Path) -> Result<Box<dyn lanes_iscsi_target::PreparedSection>, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let new =
            SmbConfig::from_file_text(file, &text, &self.data_dir).map_err(|e| e.to_string())?;
        let (server, new) = match (&self.server, new) {
            (None, None) => return Ok(Box::new(Unchanged)),
            (None, Some(_)) => {
                return Err(format!(
                    "{}: share: the SMB server is not running (it had no [[share]] at start);                      starting it needs a restart of lanes serve",
                    file.display()
                ))
            }
            (Some(_), None) => {
                return Err(format!(
                    "{}: share: no [[share]] left (or [smb] enabled = false); stopping the SMB                      server needs a restart of lanes serve",
                    file.display()
                ))
            }
            (Some(server), Some(new)) => (server, new),
        };
        let users = Users::load(&new.users_file).map_err(|e| format!("SMB users: {e}"))?;
        let applied = self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| new.clone());
        let inner = server
            .prepare_reload(&applied, &new, users)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        Ok(Box::new(PreparedSmb {
            inner,
            config: new,
            applied: self.applied.clone(),
        }))
    }
}

/// The SMB server's part of `lanes status` (key `smb`) and of `/metrics`.
pub struct SmbStatus(pub std::sync::Arc<lanes_smb_server::state::Server>);

impl lanes_iscsi_target::StatusSection for SmbStatus {
    fn key(&self) -> &'static str {
        "smb"
    }
    fn status(&self) -> serde_json::Value {
        serde_json::to_value(self.0.status()).unwrap_or_default()
    }
    fn metrics(&self, out: &mut String) {
        self.0.write_metrics(out);
    }
}

/// The banner's SMB part: each share and the Linux mount command per host address.
pub fn banner(server: &SmbServer) -> String {
    let cfg = &server.server.config;
    let mut out = String::from("\nSMB 3.1.1 shares (multichannel):\n");
    for s in &cfg.shares {
        let ro = if s.read_only { ", read-only" } else { "" };
        out.push_str(&format!("  {} -> {}{ro}\n", s.name, s.path.display()));
    }
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for l in &server.addrs {
        if l.ip().is_unspecified() {
            for nic in lanes_smb_server::ioctl::interfaces(cfg, *l) {
                if !nic.address.is_loopback() && !is_link_local(nic.address) {
                    addrs.push(SocketAddr::new(nic.address, l.port()));
                }
            }
        } else {
            addrs.push(*l);
        }
    }
    out.push_str(&mount_lines(&cfg.shares, &addrs));
    out
}

/// The host commands for `addrs` (the server's SMB addresses, the first one to mount through):
/// clients find the other addresses themselves (FSCTL_QUERY_NETWORK_INTERFACE_INFO) and open a
/// channel on each.
fn mount_lines(shares: &[lanes_smb_server::config::ShareConfig], addrs: &[SocketAddr]) -> String {
    let mut out = String::new();
    let Some(first) = addrs.first() else {
        return out;
    };
    let channels = addrs.len().clamp(1, 32);
    let port = if first.port() == 445 {
        String::new()
    } else {
        format!(",port={}", first.port())
    };
    let others = addrs.get(1..).unwrap_or_default();
    let others = if others.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = others.iter().map(|a| host(a.ip())).collect();
        format!(" (the client finds {} itself)", list.join(", "))
    };
    out.push_str(&format!(
        "Linux host, one mount per share through {}{others}; `hard` keeps I/O waiting (not\nfailing) while a channel or the server is away:\n",
        host(first.ip())
    ));
    for s in shares {
        out.push_str(&format!(
            "  mount -t cifs //{}/{} /mnt/{} -o vers=3.1.1,username=USER,multichannel,max_channels={channels},hard{port}\n",
            host(first.ip()),
            s.name,
            s.name
        ));
    }
    if let Some(s) = shares.first() {
        out.push_str(&format!(
            "Windows (PowerShell): New-SmbMapping -LocalPath S: -RemotePath \\\\{}\\{}; check with Get-SmbMultichannelConnection\n",
            host(first.ip()),
            s.name
        ));
        out.push_str(&format!(
            "macOS: /etc/nsmb.conf [default] mc_on=yes, then mount_smbfs //USER@{}/{} /Volumes/{}\n",
            host(first.ip()),
            s.name,
            s.name
        ));
    }
    out
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanes_smb_server::config::ShareConfig;

    fn share(name: &str) -> ShareConfig {
        ShareConfig {
            name: name.into(),
            path: format!("/srv/{name}").into(),
            read_only: false,
            users: Vec::new(),
        }
    }

    #[test]
    fn one_hard_multichannel_mount_per_share_through_the_first_address() {
        let addrs: Vec<SocketAddr> = vec![
            "192.0.2.10:445".parse().unwrap(),
            "198.51.100.10:445".parse().unwrap(),
        ];
        let text = mount_lines(&[share("data"), share("vm")], &addrs);
        let mounts: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("mount -t cifs"))
            .collect();
        assert_eq!(
            mounts,
            [
                "  mount -t cifs //192.0.2.10/data /mnt/data -o vers=3.1.1,username=USER,multichannel,max_channels=2,hard",
                "  mount -t cifs //192.0.2.10/vm /mnt/vm -o vers=3.1.1,username=USER,multichannel,max_channels=2,hard",
            ]
        );
        assert!(text.contains("the client finds 198.51.100.10 itself"));
        assert!(text.contains(r"New-SmbMapping -LocalPath S: -RemotePath \\192.0.2.10\data"));
        assert!(text.contains("mc_on=yes"));
    }

    #[test]
    fn another_port_is_in_the_mount_options_and_no_address_prints_nothing() {
        let addrs: Vec<SocketAddr> = vec!["[2001:db8::1]:4450".parse().unwrap()];
        let text = mount_lines(&[share("data")], &addrs);
        assert!(text.contains("//[2001:db8::1]/data /mnt/data -o vers=3.1.1,username=USER,multichannel,max_channels=1,hard,port=4450"));
        assert_eq!(mount_lines(&[share("data")], &[]), "");
    }
}
