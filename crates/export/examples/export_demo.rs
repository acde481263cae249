//! Serves a sparse in-memory disk over NBD and/or as a FUSE file until Ctrl-C, for trying
//! clients by hand:
//!
//! ```text
//! cargo run --release -p lanes-export --example export_demo -- \
//!     --size-mib 1024 --nbd unix:/tmp/demo.sock --fuse /tmp/demo-dir [--page-cache]
//! qemu-img info 'nbd+unix:///demo?socket=/tmp/demo.sock'
//! losetup --find --show /tmp/demo-dir/disk
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use lanes_export::{FuseExport, FuseOptions, MemoryDevice, NbdListen, NbdServer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut size_mib = 1024u64;
    let mut nbd: Option<NbdListen> = None;
    let mut fuse: Option<PathBuf> = None;
    let mut options = FuseOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--size-mib" => size_mib = args.next().ok_or("--size-mib N")?.parse()?,
            "--nbd" => nbd = Some(args.next().ok_or("--nbd ADDR")?.parse()?),
            "--fuse" => fuse = Some(args.next().ok_or("--fuse DIR")?.into()),
            "--page-cache" => options.direct_io = false,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let dev = Arc::new(MemoryDevice::new(size_mib << 20, 4096)?);
    let fuse = match fuse {
        Some(dir) => {
            let export =
                FuseExport::mount_with(Arc::clone(&dev), &dir, runtime.handle().clone(), options)?;
            println!("FUSE file: {}", export.disk_path().display());
            Some(export)
        }
        None => None,
    };
    runtime.block_on(async {
        let ctrl_c = async {
            tokio::signal::ctrl_c().await.ok();
        };
        match nbd {
            Some(listen) => {
                let server = NbdServer::bind(&listen, "demo").await?;
                println!("NBD export 'demo' on {}", server.local_addr());
                server.serve(Arc::clone(&dev), ctrl_c).await?;
            }
            None => ctrl_c.await,
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    if let Some(export) = fuse {
        export.unmount()?;
    }
    Ok(())
}
