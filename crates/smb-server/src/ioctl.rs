//! IOCTL: FSCTL_VALIDATE_NEGOTIATE_INFO, FSCTL_QUERY_NETWORK_INTERFACE_INFO (each listen
//! address with its link speed), FSCTL_CREATE_OR_GET_OBJECT_ID (an id from the inode), DFS
//! referrals answered "not found", the rest refused.

use std::net::IpAddr;

use smb_proto::msg::ioctl::{
    encode_network_interfaces, encode_validate_negotiate_response, NetworkInterface,
    ValidateNegotiateInfo, FSCTL_DFS_GET_REFERRALS, FSCTL_QUERY_NETWORK_INTERFACE_INFO,
    FSCTL_VALIDATE_NEGOTIATE_INFO, NETWORK_INTERFACE_CAP_RSS, SMB2_0_IOCTL_IS_FSCTL,
};
use smb_proto::msg::{FileId, IoctlRequest, IoctlResponse, Message as _};
use smb_proto::NtStatus;

use crate::conn::{Conn, Outcome, Reply};
use crate::dispatch::Ctx;
use crate::fs::status;

const FSCTL_DFS_GET_REFERRALS_EX: u32 = 0x0006_01B0;
const FSCTL_PIPE_TRANSCEIVE: u32 = 0x0011_C017;
const FSCTL_CREATE_OR_GET_OBJECT_ID: u32 = 0x0009_00C0;

/// FILE_OBJECTID_BUFFER (MS-FSCC 2.1.3.1, 64 bytes): the ObjectId is the file's inode and
/// device (stable while the file exists, nothing is stored); the birth ids repeat it, the
/// domain id is zero.
fn object_id(open: &crate::fs::open::Open, out: &mut Vec<u8>) {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&open.key.1.to_le_bytes());
    id[8..].copy_from_slice(&open.key.0.to_le_bytes());
    out.extend_from_slice(&id);
    out.extend_from_slice(&[0; 16]);
    out.extend_from_slice(&id);
    out.extend_from_slice(&[0; 16]);
}

pub fn ioctl(
    conn: &Conn,
    ctx: &Ctx<'_>,
    req: &IoctlRequest<'_>,
    fid: FileId,
    out: &mut Vec<u8>,
) -> Outcome {
    let handle_free = matches!(
        req.ctl_code,
        FSCTL_VALIDATE_NEGOTIATE_INFO
            | FSCTL_QUERY_NETWORK_INTERFACE_INFO
            | FSCTL_DFS_GET_REFERRALS
            | FSCTL_DFS_GET_REFERRALS_EX
    );
    if !handle_free && ctx.session.open(fid, ctx.tree.id).is_none() {
        return Outcome::Error(NtStatus::FILE_CLOSED);
    }
    if req.flags & SMB2_0_IOCTL_IS_FSCTL == 0 {
        return Outcome::Error(NtStatus::NOT_SUPPORTED);
    }
    let mut data = Vec::new();
    match req.ctl_code {
        FSCTL_VALIDATE_NEGOTIATE_INFO => {
            let Some(n) = conn.negotiated.as_ref() else {
                return Outcome::Disconnect("VALIDATE_NEGOTIATE_INFO before NEGOTIATE");
            };
            let Ok(v) = ValidateNegotiateInfo::decode(req.input) else {
                return Outcome::Error(NtStatus::INVALID_PARAMETER);
            };
            // Anything but what was negotiated means a tampered NEGOTIATE: drop the connection
            // (MS-SMB2 3.3.5.15.12; for 3.0 and 3.0.2 the dialect the request's list selects
            // must be the connection's).
            let cfg = crate::session::negotiate_config(&conn.server);
            if !smb_proto::server::negotiate::validates(n, &v, cfg.min_dialect, cfg.max_dialect) {
                return Outcome::Disconnect("VALIDATE_NEGOTIATE_INFO does not match the NEGOTIATE");
            }
            encode_validate_negotiate_response(
                n.server_capabilities,
                conn.server.server_guid,
                n.server_security_mode,
                n.dialect,
                &mut data,
            );
        }
        FSCTL_QUERY_NETWORK_INTERFACE_INFO => {
            let list = interfaces(&conn.server.config, conn.local);
            if list.is_empty() {
                return Outcome::Error(NtStatus::NOT_SUPPORTED);
            }
            encode_network_interfaces(&list, &mut data);
        }
        FSCTL_DFS_GET_REFERRALS | FSCTL_DFS_GET_REFERRALS_EX => {
            return Outcome::Error(status::NOT_FOUND);
        }
        FSCTL_PIPE_TRANSCEIVE => return Outcome::Error(NtStatus::NOT_SUPPORTED),
        FSCTL_CREATE_OR_GET_OBJECT_ID if ctx.session.open(fid, ctx.tree.id).is_some() => {
            let Some(open) = ctx.session.open(fid, ctx.tree.id) else {
                return Outcome::Error(NtStatus::FILE_CLOSED);
            };
            object_id(&open, &mut data);
        }
        _ => {
            let on_file = fid != FileId::RELATED && ctx.session.open(fid, ctx.tree.id).is_some();
            return Outcome::Error(if on_file {
                NtStatus::INVALID_DEVICE_REQUEST
            } else {
                NtStatus::NOT_SUPPORTED
            });
        }
    }
    if data.len() > req.max_output_response as usize {
        return Outcome::Error(NtStatus::BUFFER_TOO_SMALL);
    }
    IoctlResponse {
        ctl_code: req.ctl_code,
        file_id: fid,
        input: &[],
        output: &data,
        flags: 0,
    }
    .encode(out);
    Outcome::Reply(Reply::ok())
}

/// The interfaces to report: every listen address (a wildcard stands for every address of the
/// host, loopback left out unless the client came over it), with the link speed from
/// /sys/class/net/IF/speed or the configured override.
pub fn interfaces(
    cfg: &crate::config::SmbConfig,
    local: std::net::SocketAddr,
) -> Vec<NetworkInterface> {
    let host = host_addresses();
    let mut out: Vec<NetworkInterface> = Vec::new();
    let mut push = |ip: IpAddr, ifname: &str, index: u32| {
        if out.iter().any(|n| n.address == ip) {
            return;
        }
        let speed = cfg
            .link_speed
            .or_else(|| sysfs_speed(ifname))
            .unwrap_or(1_000_000_000);
        out.push(NetworkInterface {
            if_index: index,
            capability: if cfg.rss {
                NETWORK_INTERFACE_CAP_RSS
            } else {
                0
            },
            link_speed: speed,
            address: ip,
        });
    };
    for l in &cfg.listen {
        if l.ip().is_unspecified() {
            for (ip, name, index) in &host {
                let same_family = ip.is_ipv4() == l.ip().is_ipv4();
                if same_family && (!ip.is_loopback() || local.ip().is_loopback()) {
                    push(*ip, name, *index);
                }
            }
        } else {
            let (name, index) = host
                .iter()
                .find(|(ip, _, _)| *ip == l.ip())
                .map_or((String::new(), 1), |(_, n, i)| (n.clone(), *i));
            push(l.ip(), &name, index);
        }
    }
    out
}

fn host_addresses() -> Vec<(IpAddr, String, u32)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let index = nix::net::if_::if_nametoindex(a.interface_name.as_str()).unwrap_or(0);
        out.push((ip, a.interface_name.clone(), index));
    }
    out
}

/// Link speed in bits per second from sysfs (Mbit/s there); None when unknown.
fn sysfs_speed(ifname: &str) -> Option<u64> {
    if ifname.is_empty() || ifname.contains('/') {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed")).ok()?;
    let mbit: i64 = text.trim().parse().ok()?;
    u64::try_from(mbit)
        .ok()
        .filter(|v| *v > 0)
        .map(|v| v * 1_000_000)
}
