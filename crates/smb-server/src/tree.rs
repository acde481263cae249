//! TREE_CONNECT and TREE_DISCONNECT: shares and IPC$.

use std::sync::Arc;

use smb_proto::msg::tree::SHARE_TYPE_DISK;
use smb_proto::msg::{
    Message as _, TreeConnectRequest, TreeConnectResponse, TreeDisconnectResponse,
};
use smb_proto::NtStatus;

use crate::conn::Reply;
use crate::state::{Server, Session, Tree};

const SHARE_TYPE_PIPE: u8 = 0x02;
/// FILE_ALL_ACCESS and the read-only subset (FILE_GENERIC_READ | FILE_GENERIC_EXECUTE).
pub const ACCESS_ALL: u32 = 0x001F_01FF;
pub const ACCESS_READ_ONLY: u32 = 0x0012_00A9;

pub fn tree_connect(
    server: &Server,
    session: &Session,
    req: &TreeConnectRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let path = req.path_string().map_err(|_| NtStatus::INVALID_PARAMETER)?;
    let name = path.rsplit('\\').next().unwrap_or("");
    let (share, share_type, access) = if name.eq_ignore_ascii_case("IPC$") {
        (None, SHARE_TYPE_PIPE, ACCESS_ALL)
    } else {
        let share = server.share(name).ok_or(NtStatus::BAD_NETWORK_NAME)?;
        if !share.allows(&session.user) {
            tracing::warn!(user = %session.user, share = %share.name, "SMB tree connect refused: user not allowed");
            return Err(NtStatus::ACCESS_DENIED);
        }
        let access = if share.read_only {
            ACCESS_READ_ONLY
        } else {
            ACCESS_ALL
        };
        (Some(share), SHARE_TYPE_DISK, access)
    };
    let read_only = share.as_ref().is_some_and(|s| s.read_only);
    let tree_id = {
        let mut st = session.state.lock();
        if st.trees.len() >= crate::state::MAX_TREES {
            return Err(NtStatus::INSUFFICIENT_RESOURCES);
        }
        let id = st.next_tree;
        st.next_tree = st.next_tree.wrapping_add(1).max(1);
        st.trees.insert(
            id,
            Arc::new(Tree {
                id,
                share,
                read_only,
            }),
        );
        id
    };
    TreeConnectResponse {
        share_type,
        share_flags: 0,
        capabilities: 0,
        maximal_access: access,
    }
    .encode(out);
    Ok(Reply {
        tree_id: Some(tree_id),
        ..Reply::ok()
    })
}

pub fn tree_disconnect(
    server: &Server,
    session: &Session,
    tree_id: u32,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let opens: Vec<_> = {
        let mut st = session.state.lock();
        st.trees.remove(&tree_id);
        let ids: Vec<u64> = st
            .opens
            .iter()
            .filter(|(_, o)| o.tree() == tree_id)
            .map(|(k, _)| *k)
            .collect();
        ids.iter().filter_map(|k| st.opens.remove(k)).collect()
    };
    for o in opens {
        crate::fs::open::close_open(server, &o);
    }
    TreeDisconnectResponse.encode(out);
    Ok(Reply::ok())
}
