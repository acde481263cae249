//! One `lanes attach` per LUN per host: an exclusive flock on /run/lanes/attach-<LUN id>.lock,
//! released by the kernel when the process ends, however it ends.

use anyhow::{bail, Context as _};
use rustix::fs::{flock, FlockOperation};
use std::fs::File;
use std::path::PathBuf;

pub struct AttachLock {
    _file: File,
    path: PathBuf,
}

impl AttachLock {
    pub fn take(lun_id: &str) -> anyhow::Result<AttachLock> {
        let dir =
            PathBuf::from(std::env::var_os("LANES_RUN_DIR").unwrap_or_else(|| "/run/lanes".into()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Any identifier a target reports becomes a safe file name.
        let name: String = lun_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("attach-{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "LUN {lun_id} is already attached on this host{} (lock {}); a second attach would corrupt data",
                if holder.trim().is_empty() { String::new() } else { format!(" by pid {}", holder.trim()) },
                path.display()
            );
        }
        let _ = std::fs::write(&path, format!("{}\n", std::process::id()));
        Ok(AttachLock { _file: file, path })
    }
}

impl Drop for AttachLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
