//! `lanes lab`: emulated NICs in network namespaces, for trying multipath on one machine (see
//! the `lanes_lab` crate for how topologies, shaping and faults are built).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use lanes_lab::{Options, Rate, Topology};

#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Build a lab: a host and one or two storage nodes joined by shaped links.
    Up(UpArgs),
    /// Remove a lab: its namespaces, links, qdiscs, rules and state.
    Down {
        /// Lab name.
        name: String,
    },
    /// Inject a fault on a link (link1...), a storage node (node1, node2), a node's host side
    /// (front1, front2), a replication link (peer1...) or a node's link to the witness
    /// (witness1, witness2).
    Fail {
        /// Lab name.
        name: String,
        /// link1 ... linkN, node1, node2, front1, front2 (a node's host-facing NICs),
        /// peer1 ... peerN, witness1 or witness2.
        target: String,
        /// down | blackhole | loss=P% | delay=D[/J] (e.g. delay=50ms or delay=50ms/10ms: each
        /// direction delayed by D, jitter ±J, order kept).
        #[arg(long)]
        mode: String,
    },
    /// Take a fault back out (`all`: every fault of the lab).
    Restore {
        /// Lab name.
        name: String,
        /// link1 ... linkN, node1, node2, front1, front2, peer1 ..., witness1, witness2 or all.
        target: String,
    },
    /// Stop (SIGKILL), start or restart the etcd of a pair's witness namespace.
    Witness {
        /// Lab name.
        name: String,
        /// stop, start or restart.
        #[arg(value_parser = parse_witness_action)]
        action: lanes_lab::WitnessAction,
    },
    /// Run a command inside one of the lab's namespaces.
    Exec {
        /// Lab name.
        name: String,
        /// host, node1, node2, witness (or sw).
        namespace: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List the labs on this machine.
    List,
    /// Show a lab's addresses and the faults in force.
    Show {
        /// Lab name.
        name: String,
    },
    /// The delay relay that `fail --mode delay=...` starts inside a lab namespace.
    #[command(hide = true)]
    Relay {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct UpArgs {
    /// NICs per namespace (links between host and storage), 1..=8.
    #[arg(long)]
    nics: usize,
    /// NICs of each storage node, 1..=8, when it differs from --nics (mesh only).
    #[arg(long)]
    storage_nics: Option<usize>,
    /// Rate of every link, as tc writes it: 1gbit, 100mbit, 10gbit.
    #[arg(long, value_parser = parse_rate)]
    rate: Rate,
    /// pathing (one subnet per link), mesh (one shared switch) or lacp (one hashed aggregate).
    #[arg(long, default_value = "pathing", value_parser = parse_topology)]
    topology: Topology,
    /// Storage nodes: 1 or 2.
    #[arg(long, default_value_t = 1)]
    storage_nodes: usize,
    /// MTU of every link: 1500 or 9000.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Replication links between the two storage nodes (peer1..), 0..=8 [default: 1 with
    /// --storage-nodes 2].
    #[arg(long)]
    peer_nics: Option<usize>,
    /// Rate of the replication links [default: --rate].
    #[arg(long, value_parser = parse_rate)]
    peer_rate: Option<Rate>,
    /// No witness namespace (etcd) beside a pair.
    #[arg(long)]
    no_witness: bool,
    /// Lab name (namespaces are called lanes-NAME-host, lanes-NAME-node1, ...).
    #[arg(long, default_value = "lab")]
    name: String,
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    s.parse()
}

fn parse_topology(s: &str) -> Result<Topology, String> {
    s.parse()
}

fn parse_witness_action(s: &str) -> Result<lanes_lab::WitnessAction, String> {
    match s {
        "stop" => Ok(lanes_lab::WitnessAction::Stop),
        "start" => Ok(lanes_lab::WitnessAction::Start),
        "restart" => Ok(lanes_lab::WitnessAction::Restart),
        other => Err(format!("{other:?}: expected stop, start or restart")),
    }
}

pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        LabCommand::Up(up) => {
            let options = Options {
                name: up.name,
                topology: up.topology,
                nics: up.nics,
                storage_nics: up.storage_nics.unwrap_or(up.nics),
                rate: up.rate,
                storage_nodes: up.storage_nodes,
                mtu: up.mtu,
                pair: lanes_lab::Pair {
                    peer_nics: up.peer_nics.unwrap_or(usize::from(up.storage_nodes == 2)),
                    peer_rate: up.peer_rate,
                    witness: up.storage_nodes == 2 && !up.no_witness,
                },
            };
            // Ctrl-C while building: stop between two commands and remove what was created.
            let cancel = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&cancel);
            let watcher = tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    flag.store(true, Ordering::SeqCst);
                }
            });
            let result =
                tokio::task::spawn_blocking(move || lanes_lab::up(&options, &cancel)).await?;
            watcher.abort();
            let state = result?;
            print!("{}", state.plan.summary());
        }
        LabCommand::Down { name } => {
            let down = tokio::task::spawn_blocking(move || lanes_lab::down(&name)).await?;
            let down = down?;
            println!("removed {}", down.namespaces.join(", "));
        }
        LabCommand::Fail { name, target, mode } => {
            // A delay starts relays: this same binary, as `lanes lab relay`.
            let exe = std::env::current_exe().context("finding the lanes executable")?;
            let relay = lanes_lab::RelayCommand(vec![
                exe.to_string_lossy().into_owned(),
                "lab".into(),
                "relay".into(),
            ]);
            lanes_lab::fail(&name, &target, &mode, &relay)?;
            println!("{target} of lab {name}: {mode} (undo: lanes lab restore {name} {target})");
        }
        LabCommand::Restore { name, target } => {
            let restored = lanes_lab::restore(&name, &target)?;
            println!("restored {}", restored.join(", "));
        }
        LabCommand::Witness { name, action } => {
            let pid =
                tokio::task::spawn_blocking(move || lanes_lab::witness(&name, action)).await??;
            match pid {
                Some(pid) => println!("witness etcd running (pid {pid})"),
                None => println!("witness etcd stopped"),
            }
        }
        LabCommand::Exec {
            name,
            namespace,
            command,
        } => {
            let mut child = lanes_lab::exec_command(&name, &namespace, &command)?;
            let status = child
                .status()
                .with_context(|| format!("running {}", command.join(" ")))?;
            if !status.success() {
                // Pass the command's exit code on, as `ip netns exec` does.
                std::process::exit(status.code().unwrap_or(1));
            }
        }
        LabCommand::List => {
            for name in lanes_lab::list()? {
                println!("{name}");
            }
        }
        LabCommand::Show { name } => {
            let state = lanes_lab::state(&name)?;
            print!("{}", state.plan.summary());
            for fault in &state.faults {
                println!("fault: {} {}", fault.target, fault.mode);
            }
        }
        LabCommand::Relay { args } => {
            // Runs until killed; it reports readiness on stdout, so errors go to stderr.
            tokio::task::spawn_blocking(move || lanes_lab::relay::main(&args, std::io::stdout()))
                .await??;
        }
    }
    Ok(())
}
