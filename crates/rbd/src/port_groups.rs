//! Target port groups shared by the gateways of an image, so that REPORT TARGET PORT GROUPS
//! gives the same states through every path: each gateway publishes its groups and their ALUA
//! states in `lanes.gw.IMAGE` as `alua.GID = "TAG=STATE TAG=STATE"` (SPC-4 state codes), beside
//! its client address, and reads the others'. A gateway that is fenced loses the entry with
//! its address (`pr_store.rs` unpublishes all three), and the others then report its groups
//! unavailable (`scsi::TargetPortGroups::set_remote`).

use std::sync::{Arc, Mutex};

use crate::ffi::{ObjectIo, Pool};
use crate::pr_store::{gateways_object_name, ALUA};
use crate::Error;

/// One client's view of `lanes.gw.IMAGE` for port groups.
pub(crate) struct SharedGroups {
    object: ObjectIo,
    gid: u64,
    /// What this client published last (written again only when it changes).
    published: Mutex<Option<String>>,
}

impl SharedGroups {
    pub(crate) fn open(pool: Arc<Pool>, image: &str) -> Result<SharedGroups, Error> {
        let object = ObjectIo::open(pool, &gateways_object_name(image))?;
        let (gid, _) = object.client_identity().map_err(|e| {
            Error::Invalid(format!(
                "the client's id for {}: {e}",
                gateways_object_name(image)
            ))
        })?;
        Ok(SharedGroups {
            object,
            gid,
            published: Mutex::new(None),
        })
    }

    pub(crate) fn gid(&self) -> u64 {
        self.gid
    }

    /// Publishes `mine` (when it changed) and returns what the other gateways publish.
    pub(crate) fn share(&self, mine: &[(u16, u8)]) -> std::io::Result<Vec<(u16, u8)>> {
        let text = encode(mine);
        {
            let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
            if published.as_deref() != Some(text.as_str()) {
                self.object
                    .set_xattr(&format!("{ALUA}{}", self.gid), &text)?;
                *published = Some(text);
            }
        }
        let mut others = Vec::new();
        for (key, value) in self.object.xattrs(ALUA)? {
            let gid = key.strip_prefix(ALUA).and_then(|g| g.parse::<u64>().ok());
            if gid.is_some() && gid != Some(self.gid) {
                others.extend(decode(&value));
            }
        }
        Ok(others)
    }
}

fn encode(groups: &[(u16, u8)]) -> String {
    let items: Vec<String> = groups.iter().map(|(g, s)| format!("{g}={s}")).collect();
    items.join(" ")
}

/// The groups in a published value; what does not parse is skipped.
fn decode(text: &str) -> Vec<(u16, u8)> {
    text.split_whitespace()
        .filter_map(|item| {
            let (g, s) = item.split_once('=')?;
            Some((g.parse().ok()?, s.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_groups_read_back_and_garbage_is_skipped() {
        let groups = [(1, 0), (2, 3), (40000, 15)];
        assert_eq!(decode(&encode(&groups)), groups);
        assert_eq!(decode(""), Vec::<(u16, u8)>::new());
        assert_eq!(decode("1=0 x=1 2=y 3 70000=0 4=2"), vec![(1, 0), (4, 2)]);
    }
}
