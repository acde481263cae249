//! `lanes serve` children of this crate's binary (lanes-test-support does the work): a free
//! loopback port and a 64 MiB LUN in a temp dir, ready once the banner is out.

use std::ffi::OsStr;
use std::path::Path;

pub use lanes_test_support::serve::ServeChild as Served;
use lanes_test_support::serve::ServeCommand;

/// The binary under test.
#[allow(dead_code)]
pub fn command() -> ServeCommand {
    ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
}

#[allow(dead_code)]
pub fn serve(dir: &Path) -> Served {
    serve_on(dir, &["127.0.0.1:0"])
}

/// `lanes serve` with one portal per address (port 0: each gets a free port).
#[allow(dead_code)]
pub fn serve_on(dir: &Path, portals: &[&str]) -> Served {
    serve_with_env(dir, portals, &[])
}

/// [`serve_on`] with extra environment variables for the child (e.g. NOTIFY_SOCKET).
#[allow(dead_code)]
pub fn serve_with_env(dir: &Path, portals: &[&str], envs: &[(&str, &OsStr)]) -> Served {
    let mut command = command();
    for (key, value) in envs {
        command = command.env(key, value);
    }
    command
        .portals(portals)
        .disk(dir, "disk.img", "64M")
        .start()
}

/// `lanes ARGS...` (a `serve` command line), ready once its banner is out.
#[allow(dead_code)]
pub fn serve_with(args: &[&str]) -> Served {
    let (first, rest) = args.split_first().expect("a serve command line");
    assert_eq!(*first, "serve", "serve_with takes a serve command line");
    command().args(rest.iter().copied()).start()
}
