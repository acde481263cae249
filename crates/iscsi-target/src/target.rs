//! A configured target at run time: its logical units, ALUA port groups and policy.

use crate::config::{self, ServeConfig, TargetConfig};
use std::sync::Arc;

/// The T10 VENDOR IDENTIFICATION of every LUN (INQUIRY bytes 8-15); host configurations
/// (dm-multipath `device` sections) match it.
pub const INQUIRY_VENDOR: &str = "LANES";
/// The PRODUCT IDENTIFICATION of every LUN (INQUIRY bytes 16-31).
pub const INQUIRY_PRODUCT: &str = "lanes volume";

/// PRODUCT REVISION LEVEL (4 bytes): `MAJOR.MINOR` of the crate version (`0.1`), never a cut
/// version string such as `0.1.`.
fn product_revision() -> String {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let minor = env!("CARGO_PKG_VERSION_MINOR");
    let full = format!("{major}.{minor}");
    if full.len() <= 4 {
        full
    } else {
        major.chars().take(4).collect()
    }
}

/// One exported target: what sessions execute commands against.
pub struct TargetRuntime {
    pub config: TargetConfig,
    pub luns: Arc<scsi::LunMap>,
    pub tpgs: Arc<scsi::TargetPortGroups>,
    /// (lun, WWID string) for the banner and status.
    pub wwids: Vec<(u64, String)>,
}

/// Errors building a target from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("opening the backing file of LUN")]
    Device {
        path: String,
        #[source]
        source: blockstore::OpenError,
    },
    #[error("target {target} LUN {lun}")]
    Lun {
        target: String,
        lun: u64,
        #[source]
        source: scsi::Error,
    },
}

fn alua_state(state: config::AluaStateConfig) -> scsi::AluaState {
    scsi::AluaState::from_code(state.code()).unwrap_or(scsi::AluaState::ActiveOptimized)
}

impl TargetRuntime {
    /// Opens every LUN's backing file and builds the ALUA port groups. One target port group per
    /// portal group, whose relative target port id equals its tag.
    pub fn build(serve: &ServeConfig, config: &TargetConfig) -> Result<Self, BuildError> {
        let groups: Vec<&config::PortalGroupConfig> = serve
            .portal_groups
            .iter()
            .filter(|g| config.portal_groups.is_empty() || config.portal_groups.contains(&g.tag))
            .collect();
        let tpgs = Arc::new(scsi::TargetPortGroups::new(
            groups.iter().map(|g| (g.tag, vec![g.tag])),
        ));
        for g in &groups {
            tpgs.set_state(g.tag, alua_state(g.alua_state));
        }
        let mut units = Vec::new();
        let mut wwids = Vec::new();
        for lun in &config.luns {
            let device = blockstore::FileDevice::open(&lun.path, lun.size).map_err(|source| {
                BuildError::Device {
                    path: lun.path.display().to_string(),
                    source,
                }
            })?;
            let naa = config::naa_id(&config.name, lun);
            wwids.push((lun.lun, config::wwid_string(&naa)));
            let mut pr_file = lun.path.clone().into_os_string();
            pr_file.push(".pr");
            let lu_config = scsi::LunConfig {
                device: Arc::new(device),
                block_size: lun.block_size,
                naa_id: naa,
                serial: lun.effective_serial(&config.name),
                vendor: INQUIRY_VENDOR.into(),
                product: INQUIRY_PRODUCT.into(),
                revision: product_revision(),
                read_only: lun.read_only,
                write_cache: lun.write_cache,
                pr_file: Some(pr_file.into()),
                thin: true,
            };
            let unit = scsi::LogicalUnit::new(lu_config, tpgs.clone()).map_err(|source| {
                BuildError::Lun {
                    target: config.name.clone(),
                    lun: lun.lun,
                    source,
                }
            })?;
            units.push((lun.lun, Arc::new(unit)));
        }
        Ok(TargetRuntime {
            config: config.clone(),
            luns: Arc::new(scsi::LunMap::new(units)),
            tpgs,
            wwids,
        })
    }

    /// Whether this target is exported on portal group `tag`.
    pub fn on_portal_group(&self, tag: u16) -> bool {
        self.config.portal_groups.is_empty() || self.config.portal_groups.contains(&tag)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn product_revision_is_major_dot_minor() {
        let revision = super::product_revision();
        assert!(revision.len() <= 4, "{revision}");
        assert!(!revision.ends_with('.'), "{revision}");
        assert!(env!("CARGO_PKG_VERSION").starts_with(&revision));
    }
}
