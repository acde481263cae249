//! SMB through the lanes binary: `lanes smb user add`, `lanes serve` with a `[[share]]`, the
//! banner's mount line, smbclient put/get with checksums, and config errors that name the line.

mod served;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

fn lanes() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha256(p: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(p).unwrap()).to_vec()
}

fn config(dir: &Path, smb_port: u16, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("share")).unwrap();
    let text = format!(
        "[server]\ndata-dir = \"data\"\n\n[[portal-group]]\ntag = 1\nportals = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.lanes.test:smb\"\nportal-groups = [1]\n[[target.lun]]\n\
         path = \"data/disk.img\"\nsize = \"16M\"\n\n[smb]\nlisten = [\"127.0.0.1:{smb_port}\"]\n\n\
         [[share]]\nname = \"files\"\npath = \"share\"\n{extra}"
    );
    let path = dir.join("lanes.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn user_add_then_serve_a_share() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port, "");
    std::fs::write(dir.path().join("pw"), "s3cret pass\n").unwrap();
    let out = lanes()
        .args(["smb", "user", "add", "carol", "--config"])
        .arg(&cfg)
        .arg("--password-file")
        .arg(dir.path().join("pw"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let users = dir.path().join("data/smb-users");
    let mode = std::fs::metadata(&users).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&users).unwrap();
    // NT hash of "s3cret pass": MD4 over its UTF-16LE bytes.
    let hash = lanes_hash("s3cret pass");
    assert_eq!(text, format!("carol:{hash}\n"));

    let served = served::command()
        .args(["--config".as_ref(), cfg.as_os_str()])
        .start();
    let _ = &served;
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(local.join("a.bin"), &data).unwrap();
    let out = Command::new("smbclient")
        .arg("//127.0.0.1/files")
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "carol%s3cret pass",
            "-m",
            "SMB3",
        ])
        .args(["-c", "put a.bin a.bin; get a.bin b.bin; ls"])
        .current_dir(&local)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256(&dir.path().join("share/a.bin")),
        sha256(&local.join("a.bin"))
    );
    assert_eq!(sha256(&local.join("b.bin")), sha256(&local.join("a.bin")));
}

/// The hex NT hash, computed independently of the server crate (MD4, RFC 1320).
fn lanes_hash(password: &str) -> String {
    let msg: Vec<u8> = password.encode_utf16().flat_map(u16::to_le_bytes).collect();
    md4(&msg).iter().map(|b| format!("{b:02x}")).collect()
}

fn md4(input: &[u8]) -> [u8; 16] {
    let mut m = input.to_vec();
    let bits = (input.len() as u64) * 8;
    m.push(0x80);
    while m.len() % 64 != 56 {
        m.push(0);
    }
    m.extend_from_slice(&bits.to_le_bytes());
    let (mut a, mut b, mut c, mut d) = (
        0x6745_2301u32,
        0xefcd_ab89u32,
        0x98ba_dcfeu32,
        0x1032_5476u32,
    );
    for chunk in m.chunks(64) {
        let x: Vec<u32> = chunk
            .chunks(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let (aa, bb, cc, dd) = (a, b, c, d);
        let f = |x: u32, y: u32, z: u32| (x & y) | (!x & z);
        let g = |x: u32, y: u32, z: u32| (x & y) | (x & z) | (y & z);
        let h = |x: u32, y: u32, z: u32| x ^ y ^ z;
        for &i in &[0usize, 4, 8, 12] {
            a = a.wrapping_add(f(b, c, d)).wrapping_add(x[i]).rotate_left(3);
            d = d
                .wrapping_add(f(a, b, c))
                .wrapping_add(x[i + 1])
                .rotate_left(7);
            c = c
                .wrapping_add(f(d, a, b))
                .wrapping_add(x[i + 2])
                .rotate_left(11);
            b = b
                .wrapping_add(f(c, d, a))
                .wrapping_add(x[i + 3])
                .rotate_left(19);
        }
        for &i in &[0usize, 1, 2, 3] {
            let k = 0x5a82_7999u32;
            a = a
                .wrapping_add(g(b, c, d))
                .wrapping_add(x[i])
                .wrapping_add(k)
                .rotate_left(3);
            d = d
                .wrapping_add(g(a, b, c))
                .wrapping_add(x[i + 4])
                .wrapping_add(k)
                .rotate_left(5);
            c = c
                .wrapping_add(g(d, a, b))
                .wrapping_add(x[i + 8])
                .wrapping_add(k)
                .rotate_left(9);
            b = b
                .wrapping_add(g(c, d, a))
                .wrapping_add(x[i + 12])
                .wrapping_add(k)
                .rotate_left(13);
        }
        for &i in &[0usize, 2, 1, 3] {
            let k = 0x6ed9_eba1u32;
            a = a
                .wrapping_add(h(b, c, d))
                .wrapping_add(x[i])
                .wrapping_add(k)
                .rotate_left(3);
            d = d
                .wrapping_add(h(a, b, c))
                .wrapping_add(x[i + 8])
                .wrapping_add(k)
                .rotate_left(9);
            c = c
                .wrapping_add(h(d, a, b))
                .wrapping_add(x[i + 4])
                .wrapping_add(k)
                .rotate_left(11);
            b = b
                .wrapping_add(h(c, d, a))
                .wrapping_add(x[i + 12])
                .wrapping_add(k)
                .rotate_left(15);
        }
        a = a.wrapping_add(aa);
        b = b.wrapping_add(bb);
        c = c.wrapping_add(cc);
        d = d.wrapping_add(dd);
    }
    let mut out = [0u8; 16];
    for (i, v) in [a, b, c, d].iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    out
}

#[test]
fn md4_known_answers() {
    // RFC 1320 A.5.
    let hex = |b: [u8; 16]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(hex(md4(b"")), "31d6cfe0d16ae931b73c59d7e0c089c0");
    assert_eq!(hex(md4(b"abc")), "a448017aaf21d8525fc10ae87aa6729d");
}

#[test]
fn share_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), free_port(), "colour = \"red\"\n");
    let out = lanes()
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lanes.toml:") && err.contains("colour"),
        "{err}"
    );
    // Missing users file: a clear error that names the command to create it.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), free_port(), "");
    let out = lanes()
        .current_dir(dir.path())
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lanes smb user add"), "{err}");
}
