//! Live reconfiguration: re-read the configuration, work out the difference ([`diff`], pure),
//! open what the new configuration needs (backing files, listeners) and only then switch
//! everything over at once, so a reload either applies fully or changes nothing.
//!
//! What a reload does live: LUNs added and removed (REPORTED LUNS DATA HAS CHANGED once per
//! I_T nexus), LUNs grown (CAPACITY DATA HAS CHANGED), ACL and CHAP changes (the sessions that
//! lost access end), portals added and removed, ALUA states (ASYMMETRIC ACCESS STATE
//! CHANGED), login keys, discovery CHAP and NOP-In timers for new logins. Everything else
//! ([`NotLive`]) is refused with the key that would need a restart.

mod apply;
mod diff;
mod section;
#[cfg(test)]
mod tests;

pub use diff::{diff, Change, NotLive};
pub use section::{PreparedSection, ReloadSection};

use crate::config::{CliOverrides, ConfigError, ServeConfig};
use crate::server::Server;
use std::path::PathBuf;
use std::sync::Arc;
use tracing::{info, warn};

/// Where a reload reads the configuration from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConfigSource {
    /// Started from a configuration with no file behind it (the embedded default, or one
    /// built in code): there is nothing to re-read.
    #[default]
    Fixed,
    /// `--config FILE` with the command-line overrides, applied again on every reload.
    Cli(CliOverrides),
}

impl ConfigSource {
    /// The source for these `lanes serve` flags.
    pub fn from_cli(cli: &CliOverrides) -> ConfigSource {
        match cli.config {
            Some(_) => ConfigSource::Cli(cli.clone()),
            None => ConfigSource::Fixed,
        }
    }

    /// The file a reload re-reads, if any.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            ConfigSource::Cli(cli) => cli.config.as_deref(),
            ConfigSource::Fixed => None,
        }
    }

    fn load(&self) -> Result<(ServeConfig, PathBuf), ReloadError> {
        match self {
            ConfigSource::Cli(cli) => {
                let file = cli.config.clone().ok_or(ReloadError::NoFile)?;
                Ok((ServeConfig::from_cli(cli)?, file))
            }
            ConfigSource::Fixed => Err(ReloadError::NoFile),
        }
    }
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "this server was started without --config, so there is no file to re-read; \
         restart it with --config FILE to change it while it runs"
    )]
    NoFile,
    /// The new configuration does not validate (file:line:column: key: message).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The new configuration changes something only a restart can.
    #[error("{}: {source}", file.display())]
    NotLive {
        file: PathBuf,
        #[source]
        source: NotLive,
    },
    /// What the new configuration needs could not be opened or bound.
    #[error("{}: {key}: {message}", file.display())]
    Apply {
        file: PathBuf,
        key: String,
        message: String,
    },
    /// Another service's part of the file (SMB shares) is invalid or cannot be applied live.
    #[error("{0}")]
    Section(String),
}

impl ReloadError {
    /// The key path the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ReloadError::Invalid(e) => e.key(),
            ReloadError::NotLive { source, .. } => Some(&source.key),
            ReloadError::Apply { key, .. } => Some(key),
            ReloadError::NoFile | ReloadError::Section(_) => None,
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// The file re-read.
    pub file: PathBuf,
    /// The changes applied, in the order of [`diff`] (a grow that found the LUN already at
    /// that size is left out).
    pub changes: Vec<Change>,
    /// Sessions ended because they lost access (ACL, CHAP).
    pub sessions_ended: usize,
    /// Connections ended because their portal was removed.
    pub connections_ended: usize,
    /// What the other services' sections changed ([`ReloadSection`]), one line each.
    pub others: Vec<String>,
}

/// Re-reads the configuration from the server's [`ConfigSource`] and applies the difference,
/// or changes nothing and says why. Reloads run one at a time; the outcome is logged.
pub async fn reload(server: &Arc<Server>) -> Result<ReloadReport, ReloadError> {
    let _one_at_a_time = server.reload_lock.lock().await;
    let result = async {
        let (new, file) = server.source.load()?;
        let old = server.config();
        let mut changes = diff(&old, &new).map_err(|source| ReloadError::NotLive {
            file: file.clone(),
            source,
        })?;
        changes.extend(apply::files_grown(server, &new, &changes));
        let prepared = apply::prepare(server, &new, &changes)
            .await
            .map_err(|(key, message)| ReloadError::Apply {
                file: file.clone(),
                key,
                message,
            })?;
        let sections: Vec<_> = server.reload_sections.lock().clone();
        let mut others = Vec::new();
        for section in &sections {
            others.push(section.prepare(&file).map_err(ReloadError::Section)?);
        }
        let (mut report, retired) = apply::commit(server, new, file, changes, prepared);
        for prepared in others {
            report.others.extend(prepared.changes());
            prepared.commit();
        }
        apply::retire(retired).await;
        Ok(report)
    }
    .await;
    match &result {
        Ok(report) if report.changes.is_empty() && report.others.is_empty() => {
            info!(file = %report.file.display(), "reload: nothing changed")
        }
        Ok(report) => {
            for change in &report.changes {
                info!(file = %report.file.display(), "reload: {change}");
            }
            for change in &report.others {
                info!(file = %report.file.display(), "reload: {change}");
            }
            info!(
                changes = report.changes.len() + report.others.len(),
                sessions_ended = report.sessions_ended,
                connections_ended = report.connections_ended,
                "reload applied"
            );
        }
        Err(e) => warn!("reload refused, nothing changed: {e}"),
    }
    result
}
