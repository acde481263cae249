//! An HA pair's lab: the replication link shaped at its own rate, etcd in the witness
//! namespace reachable from each node over its own link, the faults that cut those links, the
//! witness restarted on its data, and a `down` that leaves no etcd behind. Root, ip, tc,
//! iperf3 and etcd (scripts/test.sh installs them); traffic stays inside the lab.

use std::os::fd::AsFd as _;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use lanes_lab::{Options, Pair, Topology, WitnessAction};
use lanes_witness::{EpochRecord, Error, RaceOutcome, Versioned, Witness, WitnessConfig};

struct Lab {
    name: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = lanes_lab::down(&self.name);
    }
}

impl Lab {
    fn output(&self, namespace: &str, argv: &[&str]) -> std::process::Output {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        lanes_lab::exec_command(&self.name, namespace, &argv)
            .unwrap()
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs `f` on a thread inside NAMESPACE with a tokio runtime of its own.
    fn inside<T: Send + 'static>(
        &self,
        namespace: &str,
        f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
    ) -> T {
        let path = format!("/run/netns/lanes-{}-{namespace}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f())
        })
        .join()
        .unwrap()
    }

    /// nodeK's view of the witness, through its own witness link.
    fn read(&self, node: u8) -> Result<Versioned, Error> {
        let config = witness_config(&self.name, node);
        self.inside(&format!("node{node}"), move || {
            Box::pin(async move { Witness::new(config).read().await })
        })
    }

    fn race(&self, node: u8) -> RaceOutcome {
        let config = witness_config(&self.name, node);
        self.inside(&format!("node{node}"), move || {
            Box::pin(async move { Witness::new(config).race().await })
        })
    }
}

fn witness_config(lab: &str, node: u8) -> WitnessConfig {
    let plan = lanes_lab::state(lab).unwrap().plan;
    WitnessConfig {
        endpoints: vec![plan.witness_endpoint(usize::from(node)).unwrap().into()],
        key: "/lanes/lab-test/epoch".into(),
        node: node - 1,
        timeout: Duration::from_millis(500),
    }
}

#[test]
fn a_pair_has_a_shaped_replication_link_and_a_witness_each_node_reaches_alone() {
    lanes_test_support::require_root();
    let name = format!("t{}-pair", std::process::id());
    let _ = lanes_lab::down(&name);
    let options = Options {
        name: name.clone(),
        topology: Topology::Pathing,
        nics: 2,
        storage_nics: 2,
        rate: "1gbit".parse().unwrap(),
        storage_nodes: 2,
        mtu: 1500,
        pair: Pair {
            peer_nics: 1,
            peer_rate: Some("500mbit".parse().unwrap()),
            witness: true,
        },
    };
    let state = lanes_lab::up(&options, &AtomicBool::new(false)).expect("lab up");
    let lab = Lab { name: name.clone() };
    let etcd_pid = state.witness_pid.expect("etcd runs");

    // The replication link carries its own rate (iperf3 node1 -> node2 over peer1).
    let mut server =
        lanes_lab::exec_command(&name, "node2", &["iperf3".into(), "-s".into(), "-1".into()])
            .unwrap()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab
        .output("node2", &["ss", "-Hltn", "sport = :5201"])
        .stdout
        .is_empty()
    {
        assert!(Instant::now() < deadline, "iperf3 -s never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = lab.output(
        "node1",
        &[
            "timeout",
            "30",
            "iperf3",
            "-c",
            "10.78.1.2",
            "-t",
            "3",
            "-J",
        ],
    );
    let _ = server.kill();
    let _ = server.wait();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let rate = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        (0.85e9 / 2.0..=0.5e9 * 1.01).contains(&rate),
        "peer1 at 500mbit carried {rate} bit/s"
    );

    // Each node reaches the same etcd over its own link; node1 races and wins.
    let first = lab.read(1).expect("node1 reaches the witness");
    assert_eq!(lab.read(2).unwrap(), first);
    assert_eq!(lab.race(1), RaceOutcome::Won { epoch: 1 });
    let alone: Versioned = lab.read(2).unwrap();
    assert_eq!(
        alone.record,
        EpochRecord {
            epoch: 1,
            holder: Some(0),
            outdated: Some(1)
        }
    );

    // node1 cut from the witness: it cannot read, node2 still can.
    lanes_lab::fail(
        &name,
        "witness1",
        "blackhole",
        &lanes_lab::RelayCommand(vec![]),
    )
    .unwrap();
    let err = lab.read(1).unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert_eq!(lab.read(2).unwrap(), alone);
    lanes_lab::restore(&name, "witness1").unwrap();
    assert_eq!(lab.read(1).unwrap(), alone);

    // etcd restarted on its data keeps the record.
    let pid = lanes_lab::witness(&name, WitnessAction::Restart)
        .unwrap()
        .unwrap();
    assert_ne!(pid, etcd_pid);
    assert_eq!(lab.read(2).unwrap(), alone);
    lanes_lab::witness(&name, WitnessAction::Stop).unwrap();
    assert!(matches!(lab.read(2), Err(Error::Unreachable { .. })));
    lanes_lab::witness(&name, WitnessAction::Start).unwrap();

    // A dead node2 is cut from the witness and from node1's replication link too.
    lanes_lab::fail(
        &name,
        "node2",
        "blackhole",
        &lanes_lab::RelayCommand(vec![]),
    )
    .unwrap();
    assert!(matches!(lab.read(2), Err(Error::Unreachable { .. })));
    assert_eq!(lab.read(1).unwrap(), alone);
    let reach = lab.output(
        "node1",
        &["timeout", "2", "bash", "-c", "exec 3<>/dev/tcp/10.78.1.2/9"],
    );
    assert_eq!(
        reach.status.code(),
        Some(124),
        "peer1 still answers from a dead node2"
    );
    lanes_lab::restore(&name, "all").unwrap();

    // down stops etcd and removes its files.
    let running = lanes_lab::state(&name).unwrap().witness_pid.unwrap();
    drop(lab);
    assert!(
        !std::path::Path::new(&format!("/proc/{running}")).exists() || {
            let stat = std::fs::read_to_string(format!("/proc/{running}/stat")).unwrap_or_default();
            stat.contains(") Z ")
        }
    );
    let (data, log) = lanes_lab::witness::paths(&name);
    assert!(!data.exists() && !log.exists());
    assert!(!String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout
    )
    .contains(&name));
}
