//! A configured target at run time: its logical units (a table a reload can swap), ALUA port
//! groups and policy.

use crate::config::{self, LunConfig, ServeConfig, TargetConfig};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The target's iSCSI name; never changes while the server runs.
    pub name: String,
    /// ACL, CHAP and login keys; a reload replaces it, logins read it.
    config: RwLock<Arc<TargetConfig>>,
    pub luns: LunTable,
    pub tpgs: Arc<scsi::TargetPortGroups>,
    /// With `[cluster]`: each LUN's replicated LUN (fixed for the server's life).
    pub pairs: Vec<(u64, Arc<lanes_ha::ReplicatedLun>)>,
}

/// The LUN map of a target. Connections keep a [`LunView`] and compare one generation
/// counter per command (a load of a line that only a reload writes), so commands take no lock
/// to find their LU; only a reload, which swaps the map, takes the write lock.
pub struct LunTable {
    generation: AtomicU64,
    current: RwLock<Arc<scsi::LunMap>>,
}

/// A connection's cached copy of a [`LunTable`]'s map.
pub struct LunView {
    generation: u64,
    map: Arc<scsi::LunMap>,
}

impl LunTable {
    pub fn new(map: scsi::LunMap) -> LunTable {
        LunTable {
            generation: AtomicU64::new(0),
            current: RwLock::new(Arc::new(map)),
        }
    }

    /// The current map (takes the read lock: for task management, logins and reloads).
    pub fn load(&self) -> Arc<scsi::LunMap> {
        self.current.read().clone()
    }

    /// I_T nexus loss: every LU forgets `nexus`; an SPC-2 reservation it held on a replicated
    /// LUN is released on both nodes of the pair (which waits for the peer).
    pub fn nexus_lost(&self, nexus: &scsi::Nexus) {
        let map = self.load();
        map.nexus_removed(nexus);
        if map.holds_shared_reservation(nexus) {
            // Done before the caller goes on (a logout answers after it), so the other node
            // no longer enforces it once the initiator learns its nexus is gone; the worker
            // thread's other tasks move elsewhere meanwhile.
            let release = || map.release_shared_reservations(nexus);
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(release)
                }
                Ok(_) => {
                    let (map, nexus) = (map.clone(), nexus.clone());
                    drop(tokio::task::spawn_blocking(move || {
                        map.release_shared_reservations(&nexus)
                    }));
                }
                Err(_) => release(),
            }
        }
    }

    /// Replaces the map; views see the new one at their next [`LunView::refresh`].
    pub fn store(&self, map: Arc<scsi::LunMap>) {
        *self.current.write() = map;
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn view(&self) -> LunView {
        let generation = self.generation.load(Ordering::Acquire);
        LunView {
            generation,
            map: self.load(),
        }
    }
}

impl LunView {
    /// A connection's map to run its next command against, refreshed from `target`'s table:
    /// None for a session without a target (discovery).
    pub fn current<'a>(
        view: &'a mut Option<LunView>,
        target: Option<&TargetRuntime>,
    ) -> Option<&'a Arc<scsi::LunMap>> {
        match (view, target) {
            (Some(view), Some(target)) => Some(view.refresh(&target.luns)),
            _ => None,
        }
    }

    /// The map to run the next command against: the cached one unless a reload swapped it.
    pub fn refresh(&mut self, table: &LunTable) -> &Arc<scsi::LunMap> {
        let generation = table.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.map = table.load();
            self.generation = generation;
        }
        &self.map
    }
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
    #[error("opening the RBD image {image} of LUN")]
    Rbd {
        image: String,
        #[source]
        source: lanes_rbd::Error,
    },
    #[error("target {target} LUN {lun}: starting its replication")]
    Pair {
        target: String,
        lun: u64,
        #[source]
        source: lanes_ha::Error,
    },
    #[error("target {target} LUN {lun}")]
    Lun {
        target: String,
        lun: u64,
        #[source]
        source: scsi::Error,
    },
}

/// The ALUA state of a configured portal group.
pub fn alua_state(state: config::AluaStateConfig) -> scsi::AluaState {
    scsi::AluaState::from_code(state.code()).unwrap_or(scsi::AluaState::ActiveOptimized)
}

/// Opens a LUN's backing file and creates its logical unit.
pub fn build_lu(
    target_name: &str,
    lun: &LunConfig,
    tpgs: &Arc<scsi::TargetPortGroups>,
) -> Result<Arc<scsi::LogicalUnit>, BuildError> {
    let device = open_device(target_name, lun)?;
    lu_over(target_name, lun, tpgs, device, None)
}

/// A LUN's backing device: the file or the RBD image, under a volatile cache when configured.
fn open_device(
    target_name: &str,
    lun: &LunConfig,
) -> Result<Arc<dyn blockstore::BlockDevice>, BuildError> {
    let file: Arc<dyn blockstore::BlockDevice> =
        match &lun.rbd {
            Some(source) => {
                Arc::new(
                    lanes_rbd::RbdDevice::open(source).map_err(|e| BuildError::Rbd {
                        image: source.spec(),
                        source: e,
                    })?,
                )
            }
            None => Arc::new(blockstore::FileDevice::open(&lun.path, lun.size).map_err(
                |source| BuildError::Device {
                    path: lun.path.display().to_string(),
                    source,
                },
            )?),
        };
    Ok(if lun.volatile_cache {
        tracing::warn!(
            "{target_name} LUN {}: volatile-cache is on (a test harness): writes stay in memory \
             until a flush, and kill -9 loses them",
            lun.lun
        );
        Arc::new(blockstore::VolatileDevice::new(file))
    } else {
        file
    })
}

/// The logical unit of `lun` over `device`.
fn lu_over(
    target_name: &str,
    lun: &LunConfig,
    tpgs: &Arc<scsi::TargetPortGroups>,
    device: Arc<dyn blockstore::BlockDevice>,
    pair: Option<&Arc<lanes_ha::ReplicatedLun>>,
) -> Result<Arc<scsi::LogicalUnit>, BuildError> {
    let mut pr_file = lun.path.clone().into_os_string();
    pr_file.push(".pr");
    // RBD LUNs: reservations live in a RADOS object beside the image, shared by every gateway
    // (no local file stands for state that several gateways share).
    let pr_store: Option<Arc<dyn scsi::PrStore>> = match &lun.rbd {
        Some(source) => Some(Arc::new(lanes_rbd::RadosPrStore::open(source).map_err(
            |e| BuildError::Rbd {
                image: source.spec(),
                source: e,
            },
        )?)),
        // A replicated LUN: both nodes of the pair share them through the peer link.
        None => pair.map(|p| -> Arc<dyn scsi::PrStore> {
            Arc::new(crate::pair_pr::PairPrStore::new(
                p.clone(),
                crate::pair_pr::state_path(&lun.path),
            ))
        }),
    };
    let lu_config = scsi::LunConfig {
        device,
        block_size: lun.block_size,
        naa_id: config::naa_id(target_name, lun),
        serial: lun.effective_serial(target_name),
        vendor: INQUIRY_VENDOR.into(),
        product: INQUIRY_PRODUCT.into(),
        revision: product_revision(),
        read_only: lun.read_only,
        write_cache: lun.write_cache,
        pr_file: pr_store.is_none().then(|| pr_file.into()),
        pr_store,
        thin: true,
    };
    let unit =
        scsi::LogicalUnit::new(lu_config, tpgs.clone()).map_err(|source| BuildError::Lun {
            target: target_name.to_string(),
            lun: lun.lun,
            source,
        })?;
    Ok(Arc::new(unit))
}

impl TargetRuntime {
    /// Opens every LUN's backing file and builds the ALUA port groups. One target port group per
    /// portal group, whose relative target port id equals its tag.
    pub fn build(serve: &ServeConfig, config: &TargetConfig) -> Result<Self, BuildError> {
        let on_target =
            |tag: u16| config.portal_groups.is_empty() || config.portal_groups.contains(&tag);
        let groups: Vec<&config::PortalGroupConfig> = serve
            .portal_groups
            .iter()
            .filter(|g| on_target(g.tag))
            .collect();
        // With [cluster], REPORT TARGET PORT GROUPS lists the peer's groups too.
        let peer_groups: Vec<&config::PortalGroupConfig> = serve
            .cluster
            .iter()
            .flat_map(|c| c.peer_groups())
            .filter(|g| on_target(g.tag))
            .collect();
        let tpgs = Arc::new(scsi::TargetPortGroups::new(
            groups
                .iter()
                .chain(&peer_groups)
                .map(|g| (g.tag, vec![g.tag])),
        ));
        for g in &groups {
            tpgs.set_state(g.tag, alua_state(g.alua_state));
        }
        let mut units = Vec::new();
        let mut pairs = Vec::new();
        for lun in &config.luns {
            let mut device = open_device(&config.name, lun)?;
            if let Some(cluster) = &serve.cluster {
                let pair = crate::pair::start(cluster, lun, device).map_err(|source| {
                    BuildError::Pair {
                        target: config.name.clone(),
                        lun: lun.lun,
                        source,
                    }
                })?;
                device = pair.device();
                units.push((
                    lun.lun,
                    lu_over(&config.name, lun, &tpgs, device, Some(&pair))?,
                ));
                pairs.push((lun.lun, pair));
                continue;
            }
            units.push((lun.lun, lu_over(&config.name, lun, &tpgs, device, None)?));
        }
        if !pairs.is_empty() {
            crate::pair::follow_alua(
                pairs.iter().map(|(_, p)| p.clone()).collect(),
                tpgs.clone(),
                groups.iter().map(|g| g.tag).collect(),
                peer_groups.iter().map(|g| g.tag).collect(),
            );
        }
        Ok(TargetRuntime {
            name: config.name.clone(),
            config: RwLock::new(Arc::new(config.clone())),
            luns: LunTable::new(scsi::LunMap::new(units)),
            tpgs,
            pairs,
        })
    }

    /// The target's current configuration (ACL, CHAP, login keys, LUNs).
    pub fn config(&self) -> Arc<TargetConfig> {
        self.config.read().clone()
    }

    /// Replaces the configuration new logins are checked against.
    pub fn set_config(&self, config: Arc<TargetConfig>) {
        *self.config.write() = config;
    }

    /// (lun, WWID string) of every LU, for the banner and status.
    pub fn wwids(&self) -> Vec<(u64, String)> {
        self.luns
            .load()
            .luns()
            .iter()
            .map(|(lun, lu)| (*lun, config::wwid_string(&lu.config().naa_id)))
            .collect()
    }

    /// Whether this target is exported on portal group `tag` (fixed for the server's life).
    pub fn on_portal_group(&self, tag: u16) -> bool {
        let c = self.config.read();
        c.portal_groups.is_empty() || c.portal_groups.contains(&tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lu(bytes: u64) -> Arc<scsi::LogicalUnit> {
        let device = Arc::new(blockstore::MemoryDevice::new(bytes));
        let tpgs = Arc::new(scsi::TargetPortGroups::one_per_port(1));
        let config = scsi::LunConfig {
            device,
            block_size: 512,
            naa_id: [0x60; 16],
            serial: "s".into(),
            vendor: "LANES".into(),
            product: "t".into(),
            revision: "0".into(),
            read_only: false,
            write_cache: true,
            pr_file: None,
            pr_store: None,
            thin: true,
        };
        Arc::new(scsi::LogicalUnit::new(config, tpgs).unwrap())
    }

    #[test]
    fn views_follow_the_table_at_their_next_refresh() {
        let table = LunTable::new(scsi::LunMap::new(vec![(0, lu(4096))]));
        let mut view = table.view();
        let first = view.refresh(&table).clone();
        assert!(
            Arc::ptr_eq(&first, view.refresh(&table)),
            "no swap: same map"
        );
        table.store(Arc::new(first.with_changes(&[], vec![(1, lu(4096))])));
        table.store(Arc::new(table.load().with_changes(&[0], Vec::new())));
        let now = view.refresh(&table);
        assert!(Arc::ptr_eq(now, &table.load()), "two swaps: the latest map");
        let luns: Vec<u64> = now.luns().iter().map(|(n, _)| *n).collect();
        assert_eq!(luns, [1]);
        assert!(
            first.get(0).is_some(),
            "the old map stays whole for commands using it"
        );
    }
}

#[cfg(test)]
mod revision_tests {
    #[test]
    fn product_revision_is_major_dot_minor() {
        let revision = super::product_revision();
        assert!(revision.len() <= 4, "{revision}");
        assert!(!revision.ends_with('.'), "{revision}");
        assert!(env!("CARGO_PKG_VERSION").starts_with(&revision));
    }
}
