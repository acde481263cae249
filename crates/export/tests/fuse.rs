//! The FUSE export: the file's behaviour through the kernel, and ext4 on a loop device on the
//! file, written, unmounted, remounted and checked. Needs root, /dev/fuse and loop devices;
//! fails with a clear message without them. Every mount and loop device is undone by a guard,
//! also when an assertion fails half-way.

mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use lanes_export::{FuseExport, FuseOptions, MemoryDevice};
use rustix::fs::FallocateFlags;
use support::{pattern, require_tool, run};

const MIB: u64 = 1 << 20;

fn require_privileges() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the FUSE tests mount filesystems and loop devices: run them as root"
    );
    for dev in ["/dev/fuse", "/dev/loop-control"] {
        assert!(Path::new(dev).exists(), "the FUSE tests need {dev}");
    }
}

/// Undoes mounts and loop devices in reverse order when dropped.
#[derive(Default)]
struct Cleanup {
    steps: Vec<Step>,
}

enum Step {
    Umount(PathBuf),
    /// A loop device and the file it was attached to.
    Detach(String, PathBuf),
}

impl Cleanup {
    fn losetup(&mut self, file: &Path) -> String {
        let dev = run(Command::new("losetup").args(["--find", "--show"]).arg(file))
            .trim()
            .to_string();
        self.steps
            .push(Step::Detach(dev.clone(), file.to_path_buf()));
        dev
    }

    fn mount(&mut self, dev: &str, dir: &Path) {
        run(Command::new("mount").arg(dev).arg(dir));
        self.steps.push(Step::Umount(dir.to_path_buf()));
    }

    /// Undoes the most recent step now (and checks it worked).
    fn undo_last(&mut self) {
        let step = self.steps.pop().expect("a step to undo");
        match &step {
            Step::Umount(dir) => {
                run(Command::new("umount").arg(dir));
            }
            Step::Detach(dev, file) => {
                run(Command::new("losetup").args(["-d", dev]));
                wait_released(dev, file);
            }
        }
    }
}

/// The kernel lets go of a detached loop device's backing file asynchronously; until then the
/// FUSE mount is busy. Polls the device's sysfs entry (bounded) until it no longer names
/// `file`: another test may attach its own file to the freed device meanwhile.
fn wait_released(dev: &str, file: &Path) {
    let name = dev.trim_start_matches("/dev/");
    let backing = PathBuf::from(format!("/sys/block/{name}/loop/backing_file"));
    let ours = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&backing)
        .is_ok_and(|b| Path::new(b.trim_end_matches('\n')) == ours.as_path())
    {
        assert!(
            Instant::now() < deadline,
            "{dev} still holds {} after 10 s",
            file.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        while let Some(step) = self.steps.pop() {
            let ok = match &step {
                Step::Umount(dir) => Command::new("umount").arg(dir).status(),
                Step::Detach(dev, _) => Command::new("losetup").args(["-d", dev]).status(),
            }
            .map(|s| s.success())
            .unwrap_or(false);
            if let (true, Step::Detach(dev, file)) = (ok, &step) {
                if !std::thread::panicking() {
                    wait_released(dev, file);
                }
            }
            if !ok {
                if let Step::Umount(dir) = step {
                    let _ = Command::new("umount").arg("-l").arg(dir).status();
                }
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn file_basics(options: FuseOptions) {
    require_privileges();
    let rt = runtime();
    let dev = Arc::new(MemoryDevice::new(64 * MIB, 4096).unwrap());
    let background = pattern(MIB as usize, 11);
    dev.write_bytes(0, &background).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fuse =
        FuseExport::mount_with(Arc::clone(&dev), dir.path(), rt.handle().clone(), options).unwrap();
    let disk = fuse.disk_path();
    assert_eq!(disk, dir.path().join("disk"));

    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["disk"]);
    let meta = std::fs::metadata(&disk).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), 64 * MIB);
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());

    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk)
        .unwrap();
    let mut buf = vec![0u8; 10_000];
    file.read_exact_at(&mut buf, 1234).unwrap();
    assert!(buf[..] == background[1234..11_234], "unaligned read");

    let data = pattern(5000, 12);
    file.write_all_at(&data, 4090).unwrap();
    assert!(
        dev.read_bytes(4090, 5000).unwrap()[..] == data[..],
        "write reached the device"
    );
    assert!(
        dev.read_bytes(0, 4090).unwrap()[..] == background[..4090],
        "neighbours intact"
    );

    let flushes = dev.stats().flushes;
    file.sync_all().unwrap();
    assert!(dev.stats().flushes > flushes, "fsync flushes the device");

    // Hole punch and zero range both leave zeroes; the first is a trim on this device.
    let trims = dev.stats().trims;
    rustix::fs::fallocate(
        &file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        100,
        3 * 4096,
    )
    .unwrap();
    assert!(dev.stats().trims > trims);
    assert!(dev
        .read_bytes(100, 3 * 4096)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert!(
        dev.read_bytes(3 * 4096 + 100, 100).unwrap()[..]
            == background[3 * 4096 + 100..3 * 4096 + 200]
    );
    let zeroes = dev.stats().write_zeroes;
    rustix::fs::fallocate(&file, FallocateFlags::ZERO_RANGE, 65536, 65536).unwrap();
    assert!(dev.stats().write_zeroes > zeroes);
    assert!(dev
        .read_bytes(65536, 65536)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    file.read_exact_at(&mut buf[..4096], 65536).unwrap();
    assert!(
        buf[..4096].iter().all(|&b| b == 0),
        "zeroes visible through the file"
    );

    // The disk neither grows nor shrinks.
    let err = file.write_at(b"x", 64 * MIB).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(28), "ENOSPC past the end: {err}");
    assert!(file.set_len(MIB).is_err());
    assert!(OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&disk)
        .is_err());
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 64 * MIB);
    // Reads at the end are short, as for any file.
    assert_eq!(file.read_at(&mut buf, 64 * MIB - 10).unwrap(), 10);

    // O_DSYNC writes are FUA writes.
    let sync_file = OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DSYNC.bits() as i32)
        .open(&disk)
        .unwrap();
    let fua = dev.stats().fua_writes;
    sync_file.write_all_at(&[9u8; 4096], 8192).unwrap();
    assert!(dev.stats().fua_writes > fua);
    drop(sync_file);
    drop(file);

    fuse.unmount().expect("clean unmount");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing mounted any more"
    );
}

#[test]
fn fuse_file_maps_to_the_device_direct_io() {
    file_basics(FuseOptions::default());
}

#[test]
fn fuse_file_maps_to_the_device_page_cache() {
    file_basics(FuseOptions {
        direct_io: false,
        ..FuseOptions::default()
    });
}

#[test]
fn fuse_unmount_of_a_busy_file_is_an_error_and_detaches() {
    require_privileges();
    let rt = runtime();
    let dev = Arc::new(MemoryDevice::new(4 * MIB, 512).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let fuse = FuseExport::mount(Arc::clone(&dev), dir.path(), rt.handle().clone()).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fuse.disk_path())
        .unwrap();
    let err = fuse.unmount().expect_err("busy: the file is open");
    assert!(err.to_string().contains("detached"), "{err}");
    // Detached: gone from the tree, still served to the open file.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    file.write_all_at(b"still here", 0).unwrap();
    assert_eq!(&dev.read_bytes(0, 10).unwrap()[..], b"still here");
}

/// Writes a tree of files on ext4 on a loop device on the FUSE file, unmounts everything,
/// mounts again through a fresh FUSE mount and loop device, and checks fsck and every byte.
fn ext4_round_trip(options: FuseOptions) {
    require_privileges();
    for (tool, package) in [
        ("losetup", "mount"),
        ("mkfs.ext4", "e2fsprogs"),
        ("e2fsck", "e2fsprogs"),
    ] {
        require_tool(tool, package);
    }
    let rt = runtime();
    let dev = Arc::new(MemoryDevice::new(256 * MIB, 4096).unwrap());
    let work = tempfile::tempdir().unwrap();
    let fuse_dir = work.path().join("fuse");
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&fuse_dir).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| {
            let len = (i * 97_531) % (3 * MIB as usize) + i;
            (
                format!("dir{}/file{i}", i % 3),
                pattern(len, 100 + i as u64),
            )
        })
        .collect();

    let started = Instant::now();
    {
        let fuse =
            FuseExport::mount_with(Arc::clone(&dev), &fuse_dir, rt.handle().clone(), options)
                .unwrap();
        let mut cleanup = Cleanup::default();
        let loop_dev = cleanup.losetup(&fuse.disk_path());
        run(Command::new("mkfs.ext4").args(["-q", &loop_dev]));
        let mkfs_done = started.elapsed();
        cleanup.mount(&loop_dev, &mnt);
        for (name, data) in &files {
            let path = mnt.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, data).unwrap();
        }
        run(&mut Command::new("sync"));
        cleanup.undo_last(); // umount
        cleanup.undo_last(); // losetup -d
        fuse.unmount()
            .expect("FUSE unmounts once the loop device is gone");
        println!(
            "ext4 on loop on FUSE (direct_io={}): mkfs {:?}, mkfs+write {} MiB+umount {:?}",
            options.direct_io,
            mkfs_done,
            files.iter().map(|(_, d)| d.len()).sum::<usize>() >> 20,
            started.elapsed()
        );
    }
    assert!(
        dev.stats().flushes > 0,
        "the filesystem flushed through the file"
    );

    let fuse_dir2 = work.path().join("fuse2");
    std::fs::create_dir(&fuse_dir2).unwrap();
    let fuse =
        FuseExport::mount_with(Arc::clone(&dev), &fuse_dir2, rt.handle().clone(), options).unwrap();
    let mut cleanup = Cleanup::default();
    let loop_dev = cleanup.losetup(&fuse.disk_path());
    run(Command::new("e2fsck").args(["-fn", &loop_dev]));
    cleanup.mount(&loop_dev, &mnt);
    for (name, data) in &files {
        let back = std::fs::read(mnt.join(name)).unwrap();
        assert!(back == *data, "{name} survived unmount and remount");
    }
    drop(cleanup);
    fuse.unmount().unwrap();
}

#[test]
fn ext4_on_a_loop_device_on_the_fuse_file_survives_remount() {
    ext4_round_trip(FuseOptions::default());
}

#[test]
fn ext4_on_a_loop_device_on_the_fuse_file_with_page_cache() {
    ext4_round_trip(FuseOptions {
        direct_io: false,
        ..FuseOptions::default()
    });
}

/// One device served over NBD and FUSE at once through one `AlignedIo`: a FUSE write and an
/// NBD write into different halves of the same block, at the same moment, both land.
#[test]
fn nbd_and_fuse_writers_share_one_range_lock() {
    use lanes_export::aligned::AlignedIo;
    use lanes_export::{NbdListen, NbdServer};
    use support::client::Client;
    use support::devices::TestDevice;

    require_privileges();
    let rt = runtime();
    let dev = Arc::new(TestDevice::new(
        MemoryDevice::new(16 * MIB, 4096).unwrap(),
        None,
        true,
    ));
    let io = Arc::new(AlignedIo::new(Arc::clone(&dev)).unwrap());
    let work = tempfile::tempdir().unwrap();
    let socket = work.path().join("nbd.sock");
    let fuse_dir = work.path().join("fuse");
    std::fs::create_dir(&fuse_dir).unwrap();
    let server = rt
        .block_on(NbdServer::bind(
            &NbdListen::Unix(socket.clone()),
            support::EXPORT,
        ))
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = rt.spawn(server.serve_aligned(Arc::clone(&io), async move {
        stopped.await.ok();
    }));
    let fuse = FuseExport::mount_aligned(
        Arc::clone(&io),
        &fuse_dir,
        rt.handle().clone(),
        FuseOptions::default(),
    )
    .unwrap();
    let file = OpenOptions::new()
        .write(true)
        .open(fuse.disk_path())
        .unwrap();
    let mut client = rt.block_on(Client::connect(&format!("unix:{}", socket.display())));

    const ROUNDS: u64 = 300;
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for round in 0..ROUNDS {
                barrier.wait();
                file.write_all_at(&[0xF0; 1024], round * 4096 + 512)
                    .unwrap();
            }
        });
        for round in 0..ROUNDS {
            barrier.wait();
            rt.block_on(client.write(round * 4096 + 2048, &[0x0B; 1024]));
        }
    });
    for round in 0..ROUNDS {
        let block = dev.inner.read_bytes(round * 4096, 4096).unwrap();
        assert!(
            block[512..1536].iter().all(|&b| b == 0xF0),
            "round {round}: FUSE bytes lost"
        );
        assert!(
            block[2048..3072].iter().all(|&b| b == 0x0B),
            "round {round}: NBD bytes lost"
        );
        assert!(block[..512]
            .iter()
            .chain(&block[1536..2048])
            .chain(&block[3072..])
            .all(|&b| b == 0));
    }
    drop(file);
    rt.block_on(client.disconnect());
    stop.send(()).unwrap();
    rt.block_on(serving).unwrap().unwrap();
    fuse.unmount().unwrap();
}
